"""Planted: launch-bound. A 12-layer MLP of width 256 at batch 32: tiny kernels, the GPU waits on launches."""
import torch

from _loop import repeat, train

layers = []
for _ in range(12):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10)).cuda()
x, y = torch.randn(32, 256, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
train(model, repeat(x, y))
