"""Built-in models without torchvision: a small conv net and ResNet-18/50 of our own.

`resolve_model("resnet50")` uses torchvision's when it is installed (same
numbers as the literature), else ours (same architecture, torchvision's
layer names). Any "module:function" returning an nn.Module is accepted too.
"""
from __future__ import annotations

import importlib
import inspect

import torch
from torch import nn

from ..errors import EngineError


class SmallNet(nn.Module):
    """Four conv blocks and a linear head: fast enough to train in CPU tests."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        layers, c = [], 3
        for k in range(4):
            layers += [nn.Conv2d(c, width << k, 3, 2, 1, bias=False), nn.BatchNorm2d(width << k),
                       nn.ReLU(inplace=True)]
            c = width << k
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + idt)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + idt)


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        cin, stages = 64, []
        for i, n in enumerate(layers):
            width = 64 * 2**i
            blocks = [block(cin, width, 1 if i == 0 else 2)]
            cin = width * block.expansion
            blocks += [block(cin, width) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet50(num_classes: int = 1000) -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


def resolve_model(name: str, num_classes: int) -> nn.Module:
    """'smallnet' | 'resnet18' | 'resnet50' | 'package.module:function'."""
    if ":" in name:
        mod, _, fn = name.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise EngineError(f"--model {name}: cannot import ({e}); give module:function on PYTHONPATH") from e
        try:   # its own errors keep their traceback; a function that cannot take num_classes= is named
            inspect.signature(factory).bind(num_classes=num_classes)
        except TypeError as e:
            raise EngineError(f"--model {name}: cannot be called as {fn}(num_classes={num_classes}) ({e}); give "
                              f"a function that takes num_classes= and returns an nn.Module") from None
        except ValueError:    # a builtin without a signature: call it and see
            pass
        model = factory(num_classes=num_classes)
        if not isinstance(model, nn.Module):
            raise EngineError(f"--model {name}: returned {type(model).__name__}, not an nn.Module")
        return model
    if name in ("resnet18", "resnet50"):
        try:
            import torchvision.models as tvm

            return getattr(tvm, name)(num_classes=num_classes)
        except Exception:  # noqa: BLE001 - absent or broken torchvision: ours has the same architecture
            return {"resnet18": resnet18, "resnet50": resnet50}[name](num_classes)
    if name == "smallnet":
        return SmallNet(num_classes)
    raise EngineError(f"--model {name}: unknown; choose smallnet, resnet18, resnet50 or module:function")
