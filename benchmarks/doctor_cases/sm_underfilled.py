"""Planted: SM-underfilled ("one SM at 100%"). Each step runs a long single-block kernel (a custom op
stand-in: torch.cuda._sleep spins one thread) beside a small MLP: the GPU is never idle, its SMs are."""
import torch

from _loop import repeat, train


class OneBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def forward(self, x):
        torch.cuda._sleep(2_000_000)    # ~1 ms on one SM
        return self.body(x)


model = OneBlock().cuda()
x, y = torch.randn(256, 256, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
train(model, repeat(x, y))
