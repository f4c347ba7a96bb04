"""The course's toy model: one small MLP builder, the same weights for the same seed in every process."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


def mlp(widths, *, activation=nn.ReLU, batchnorm: bool = False, seed: int | None = 0, dtype=None) -> nn.Sequential:
    """Linear layers ``widths[0] -> widths[1] -> ...`` with ``activation`` between them, named fc1, relu1, fc2, ...

    ``batchnorm`` puts a BatchNorm1d (bn1) after the first layer. A given ``seed`` gives the same weights in
    every process and leaves the caller's random state alone; ``seed=None`` draws from it, as PyTorch does.
    """
    layers = OrderedDict()
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True), 1):
            layers[f"fc{i}"] = nn.Linear(a, b)
            if i == 1 and batchnorm:
                layers["bn1"] = nn.BatchNorm1d(b)
            if i < len(widths) - 1:
                layers[f"{activation.__name__.lower()}{i}"] = activation()
    model = nn.Sequential(layers)
    return model if dtype is None else model.to(dtype)
