"""A multilayer perceptron classifier with a cross-entropy loss.

    estimator estimate examples/mlp.py:build --optimizer sgd:momentum=0.9
"""

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, in_features: int = 784, hidden: int = 1024, depth: int = 3, classes: int = 10):
        super().__init__()
        dims = [in_features] + [hidden] * depth
        self.hidden = nn.Sequential(*[
            nn.Sequential(nn.Linear(a, b), nn.GELU(), nn.Dropout(0.1)) for a, b in zip(dims, dims[1:])
        ])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.hidden(x.flatten(1)))  # (B, classes)
        return F.cross_entropy(logits, target)  # scalar: the loss


def build(batch: int = 256):
    model = MLP()
    x = torch.randn(batch, 1, 28, 28)
    target = torch.randint(0, 10, (batch,))
    return model, (x, target)
