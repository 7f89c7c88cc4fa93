"""Planted: input-bound. PIL decode + resize in 2 DataLoader workers feeding ResNet-18 (bf16)."""
import sys
from pathlib import Path

import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from _loop import train


class Folder(Dataset):
    def __init__(self, root):
        self.files = sorted(Path(root).rglob("*.jpg"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB").resize((224, 224))
        x = torch.from_numpy(__import__("numpy").asarray(img)).permute(2, 0, 1).float() / 255
        return x, i % 10


model = torchvision.models.resnet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
loader = DataLoader(Folder(sys.argv[1]), 128, shuffle=True, num_workers=2)
train(model, (b for _ in range(100) for b in loader), autocast=torch.bfloat16)
