"""Planted: compute-bound. ResNet-50 in bf16, channels_last, batch 256, data already on the GPU."""
import torch
import torchvision

from _loop import repeat, train

model = torchvision.models.resnet50(num_classes=10).cuda().to(memory_format=torch.channels_last)
x = torch.randn(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
train(model, repeat(x, torch.randint(0, 10, (256,), device="cuda")), autocast=torch.bfloat16)
