"""Planted: h2d-bound. Pageable float32 batches of 256x3x224x224 (154 MB) copied every step into a tiny net."""
import torch

from _loop import repeat, train

model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                            torch.nn.Linear(8, 10)).cuda()
x = torch.randn(256, 3, 224, 224)           # pageable host memory
train(model, repeat(x, torch.randint(0, 10, (256,))), autocast=torch.bfloat16)
