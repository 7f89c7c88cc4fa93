"""Read side: open caches, order samples, load batches to the GPU, augment there."""
