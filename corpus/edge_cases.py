"""Small hand-written modules that exercise what breaks FX passes.

Each is cheap to build and run, so the project's own tests and quick local
runs use them; the catalogue (``models.toml``) lists them as ``edge`` entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvBnHead(nn.Module):
    """conv -> BN -> relu twice, dropout, flatten, linear: a conv/BN fusion target
    with a classifier head, in 2 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(self.drop(torch.flatten(x, 1)))
