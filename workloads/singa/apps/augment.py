"""Random affine deformations of digit images, the distortion training of the MLP that 4.1
reproduces (Ciresan et al. 2010 train the "big simple" MLP on deformed digits): each image
gets its own small rotation, scale and sub-pixel shift, resampled bilinearly."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def deform(pixels: torch.Tensor, hw: tuple[int, int], generator: torch.Generator,
           rotate_deg: float = 10.0, scale: float = 0.08, shift_px: float = 0.6) -> torch.Tensor:
    """(N, H*W) or (N, C, H, W) uint8 images -> the same shape/dtype, each randomly deformed."""
    n = pixels.shape[0]
    h, w = hw
    img = pixels.reshape(n, -1, h, w).float()
    angle = (torch.rand(n, generator=generator) * 2 - 1) * math.radians(rotate_deg)
    zoom = 1 + (torch.rand(n, generator=generator) * 2 - 1) * scale
    shift = (torch.rand(n, 2, generator=generator) * 2 - 1) * shift_px * 2 / torch.tensor([w, h])
    cos, sin = zoom * torch.cos(angle), zoom * torch.sin(angle)
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(img.shape), align_corners=False)
    out = F.grid_sample(img, grid, align_corners=False, padding_mode="zeros")
    return out.round().clamp(0, 255).to(pixels.dtype).reshape(pixels.shape)
