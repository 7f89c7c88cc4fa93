"""Shard stores: where a cache's files live when they are not a local folder.

    local folder      the default: every layer reads and writes paths directly
    s3://bucket/pfx   any S3-compatible endpoint (AWS, MinIO, R2, GCS interop) through s3fs
                      (s3.py): builds read inputs and upload finished shards; readers fetch shards
                      ahead of the sample order into a bounded local folder (fetch.py)

Why s3fs: it is the maintained fsspec implementation for S3, speaks to any endpoint through
``endpoint_url``, takes credentials from the usual AWS variables or explicit storage options, and
its ``get_file``/``put_file``/``find`` are all a build and a reader need. obstore is faster per
request, but fastdata moves whole shards of hundreds of MB, where the request layer does not matter.
"""
