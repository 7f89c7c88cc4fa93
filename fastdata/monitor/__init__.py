"""Monitor: NVML sampler (duty cycle and GPM SM activity), profiler wrapper, doctor."""
