"""The deep linear "Cruncher" of CS336 lecture 2 (resource accounting).

``num_layers`` layers of ``x @ W`` with ``W`` of shape D x D (no bias), then a
D x 1 head; the loss is the mean of the output.  Per token the forward pass
costs 2 * (num_layers * D * D + D) FLOPs (2 per multiply-add) and the backward
pass twice that, except that the first layer computes no input gradient.

    estimator estimate examples/cruncher.py:build
"""

import math

import torch
from torch import nn


class Linear(nn.Module):
    """``x @ W`` with W of shape (input_dim, output_dim), no bias (as in the lecture)."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(input_dim, output_dim) / math.sqrt(input_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class Cruncher(nn.Module):
    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([Linear(dim, dim) for _ in range(num_layers)])
        self.final = Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, D)
        for layer in self.layers:
            x = layer(x)  # (B, D)
        x = self.final(x)  # (B, 1)
        return x.squeeze(-1)  # (B,)


def build(batch: int = 128, dim: int = 4096, num_layers: int = 8):
    """A 134M-parameter Cruncher on the meta device (no weights allocated) and a batch of inputs."""
    with torch.device("meta"):
        model = Cruncher(dim, num_layers)
        x = torch.randn(batch, dim)
    return model, x
