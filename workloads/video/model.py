"""Two-stream networks: a small ResNet-style CNN per stream.

The notes train ResNet-50 / ResNeXt / Inception / DenseNet per stream from
ImageNet-22k weights; with no pretrained weights and 2 CPU cores here, the default
is a small ResNet (BasicBlocks, widths in config) trained from scratch. The same
class serves both streams; only ``in_channels`` differs (3 for rgb, 2L for flow,
L for framediff, ``bins`` for hog). A model never knows how it is distributed.
"""
from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN + shortcut (1x1 conv when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class StreamNet(nn.Module):
    """uint8 feature maps (N, C, H, W) -> class logits (N, num_classes).

    Input is normalised inside the net ((x / 255 - 0.5) * 2) so every stream's
    uint8 encoding (rgb, quantized flow centred at 127.5, framediff centred at
    127.5) enters as roughly [-1, 1].
    """

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (16, 32, 64),
                 dropout: float = 0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(c, w, stride=1 if i == 0 else 2))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(c, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() / 255.0 - 0.5) * 2.0
        return self.head(self.blocks(self.stem(x)))


def build_stream_model(in_channels: int, num_classes: int, widths, dropout: float = 0.2) -> StreamNet:
    """The per-stream CNN; ``widths`` is one channel count per ResNet stage."""
    return StreamNet(in_channels, num_classes, tuple(int(w) for w in widths), dropout)


def load_model(state: bytes, in_channels: int, num_classes: int, widths, dropout: float):
    """The eval-mode model of a stream from its state bytes (a ``replica.state_dict()``: train.py)."""
    model = build_stream_model(in_channels, num_classes, widths, dropout)
    model.load_state_dict(torch.load(io.BytesIO(state), weights_only=True)["model"])
    return model.eval()


def predict(model, features: np.ndarray, batch: int = 256) -> np.ndarray:
    """Softmax probabilities (N, C) for uint8 features (N, C_in, H, W)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(features), batch):
            out.append(torch.softmax(model(torch.as_tensor(features[i:i + batch])), 1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))
