"""The plain recipe the benchmarks compare against: a PIL ImageFolder with CPU transforms.

What a user writes without torchvision: decode with PIL, RandomResizedCrop(224),
horizontal flip, to float CHW, normalise, all in DataLoader workers.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from fastdata.cache.sources import discover
from fastdata.read.augment import AugmentConfig, IMAGENET_MEAN, IMAGENET_STD
from fastdata.read.crop_box import crop_box

_MEAN = np.array(IMAGENET_MEAN, np.float32).reshape(3, 1, 1) * 255
_STD = np.array(IMAGENET_STD, np.float32).reshape(3, 1, 1) * 255


class PilFolder(Dataset):
    def __init__(self, root, size: int = 224, seed: int = 0) -> None:
        self.items = discover(root).items
        self.cfg = AugmentConfig(size=size)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        item = self.items[i]
        rng = np.random.default_rng([self.seed, i, torch.initial_seed() % 2**31])
        img = Image.open(item.path).convert("RGB")
        t, left, h, w = crop_box(img.height, img.width, self.cfg, rng)
        img = img.resize((self.cfg.size, self.cfg.size), Image.BILINEAR, box=(left, t, left + w, t + h))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = (np.asarray(img, np.float32).transpose(2, 0, 1) - _MEAN) / _STD
        return torch.from_numpy(x), item.label
