"""Target normalisation of box deltas, column by column with Python numbers.

mmdet's coders build their means/stds with `deltas.new_tensor(...)`, a copy from host memory
that makes the host wait for the GPU (and cannot be captured in a CUDA graph). Here each column
is shifted and scaled by Python floats; identity columns (mean 0, std 1) cost nothing. The
division is by a device scalar made on the device: torch divides a CUDA tensor by a Python number
through its reciprocal, one rounding away from mmdet's division by a tensor.
"""
from typing import Sequence

import torch
from torch import Tensor


def normalize_deltas(deltas: Tensor, means: Sequence[float], stds: Sequence[float]) -> Tensor:
    """(deltas - means) / stds over the last dimension."""
    if _identity(means, stds):
        return deltas
    return torch.stack([(c - m) / c.new_full((), s) if (m, s) != (0, 1) else c
                        for c, m, s in zip(deltas.unbind(-1), means, stds)], dim=-1)


def denormalize_deltas(deltas: Tensor, means: Sequence[float], stds: Sequence[float]) -> Tensor:
    """deltas * stds + means over the last dimension (the inverse of normalize_deltas)."""
    if _identity(means, stds):
        return deltas
    return torch.stack([c * s + m if (m, s) != (0, 1) else c
                        for c, m, s in zip(deltas.unbind(-1), means, stds)], dim=-1)


def _identity(means: Sequence[float], stds: Sequence[float]) -> bool:
    return all(m == 0 for m in means) and all(s == 1 for s in stds)
