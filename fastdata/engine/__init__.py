"""Training engine: AMP, torch.compile, CUDA-graph step capture, accumulation, DDP/ZeRO, checkpoints."""
