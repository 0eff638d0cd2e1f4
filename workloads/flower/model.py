"""The thesis's counting CNN: MCNN with two transposed convolutions per column (Fig. 3.1).

Layer shapes follow Table 3.1 (three columns) and Table 3.2 (the final 1x1 convolution).
TensorFlow stores a conv kernel as (kh, kw, in, out) and a transposed-conv kernel as
(kh, kw, out, in); PyTorch stores (out, in, kh, kw) and (in, out, kh, kw). The table's
deconv shapes therefore say: deconv1 maps conv4's maps to as many maps, deconv2 maps them to
conv3's width (16 / 20 / 24), so the concatenation has 16 + 20 + 24 = 60 maps (Table 3.2).

The thesis's text says 138,505 parameters; summing its own Table 3.1/3.2 gives a different
total (see `count_parameters`). The table is the more detailed source, so this model follows it.
"""
from __future__ import annotations

import torch
from torch import nn

# (kernel sizes conv1..conv4, filters conv1..conv4) per column, Table 3.1.
COLUMNS: tuple[tuple[tuple[int, int, int, int], tuple[int, int, int, int]], ...] = (
    ((9, 7, 7, 7), (16, 32, 16, 8)),
    ((7, 5, 5, 5), (20, 40, 20, 10)),
    ((5, 3, 3, 3), (24, 48, 24, 12)),
)


class Column(nn.Module):
    """One MCNN column: conv, pool, conv, pool, conv, conv, deconv x2 back to input size."""

    def __init__(self, kernels: tuple[int, int, int, int], filters: tuple[int, int, int, int]):
        super().__init__()
        k1, k2, k3, k4 = kernels
        f1, f2, f3, f4 = filters
        # "same" padding keeps the spatial size, so only the two pools change it.
        self.conv1 = nn.Conv2d(3, f1, k1, padding=k1 // 2)
        self.conv2 = nn.Conv2d(f1, f2, k2, padding=k2 // 2)
        self.conv3 = nn.Conv2d(f2, f3, k3, padding=k3 // 2)
        self.conv4 = nn.Conv2d(f3, f4, k4, padding=k4 // 2)
        # Stride-2 transposed convs with output_padding=1 exactly double the size (odd kernels),
        # undoing the two 2x2 pools: the density map comes out at input resolution.
        self.deconv1 = nn.ConvTranspose2d(f4, f4, k4, stride=2, padding=k4 // 2, output_padding=1)
        self.deconv2 = nn.ConvTranspose2d(f4, f3, k4, stride=2, padding=k4 // 2, output_padding=1)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU(inplace=True)

    @property
    def out_channels(self) -> int:
        return self.deconv2.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        x = self.act(self.conv3(x))
        x = self.act(self.conv4(x))
        x = self.act(self.deconv1(x))
        return self.act(self.deconv2(x))


class FlowerCounterCNN(nn.Module):
    """Images (B, 3, H, W) in [0, 1], H and W multiples of 4 -> density maps (B, 1, H, W).

    The sum of a predicted map over its pixels is the flower count (after dividing by the
    training target scale, see `train.py`).
    """

    def __init__(self):
        super().__init__()
        self.columns = nn.ModuleList(Column(k, f) for k, f in COLUMNS)
        merged = sum(c.out_channels for c in self.columns)  # 60, Table 3.2
        self.final_conv = nn.Conv2d(merged, 1, kernel_size=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        maps = torch.cat([column(images) for column in self.columns], dim=1)
        return self.final_conv(maps)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def euclidean_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Pixel-wise Euclidean loss of the thesis's code (Appendix, `do_training`).

    mean over the batch of sqrt(sum over pixels of (target - predicted)^2); shapes (B, 1, H, W).
    A tiny epsilon keeps the gradient of sqrt finite when a map is predicted exactly.
    """
    squared = (target - predicted).pow(2).sum(dim=(1, 2, 3))
    return torch.sqrt(squared + 1e-12).mean()
