"""Write side: turn source files into checksummed shards plus a manifest."""
