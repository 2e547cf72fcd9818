"""A small VGG-style CNN: stacks of 3x3 conv + batch norm + ReLU, max pooling, a linear head.

    estimator estimate examples/vgg.py:build
    estimator estimate examples/vgg.py:model --input 32x3x64x64
"""

import torch
from torch import nn

CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M")


class VGG(nn.Module):
    def __init__(self, config=CONFIG, in_channels: int = 3, classes: int = 100):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for v in config:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1, bias=False), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        h = self.pool(self.features(x)).flatten(1)  # (B, C)
        logits = self.classifier(h)  # (B, classes)
        if target is None:
            return logits
        return nn.functional.cross_entropy(logits, target)


def model():
    """The model alone: give the inputs with --input BxCxHxW."""
    return VGG()


def build(batch: int = 32, size: int = 64):
    with torch.device("meta"):
        net = VGG()
    return net, (torch.randn(batch, 3, size, size, device="meta"), torch.randint(0, 100, (batch,), device="meta"))
