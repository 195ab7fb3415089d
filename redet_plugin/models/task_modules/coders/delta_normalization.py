"""Target normalisation of box deltas, with means and stds kept on the device.

mmdet's coders build their means/stds with `deltas.new_tensor(...)` in every call, a copy from
host memory that makes the host wait for the GPU (and cannot be captured in a CUDA graph). Here
they are kept device constants (models/utils/device_constants.py): mmdet's formula, element for
element.
"""
from typing import Sequence

from torch import Tensor

from redet_plugin.models.utils.device_constants import constant


def normalize_deltas(deltas: Tensor, means: Sequence[float], stds: Sequence[float]) -> Tensor:
    """(deltas - means) / stds over the last dimension."""
    if _identity(means, stds):
        return deltas
    return (deltas - constant(means, deltas.dtype, deltas.device)) / constant(
        stds, deltas.dtype, deltas.device)


def denormalize_deltas(deltas: Tensor, means: Sequence[float], stds: Sequence[float]) -> Tensor:
    """deltas * stds + means over the last dimension (the inverse of normalize_deltas)."""
    if _identity(means, stds):
        return deltas
    return deltas * constant(stds, deltas.dtype, deltas.device) + constant(
        means, deltas.dtype, deltas.device)


def _identity(means: Sequence[float], stds: Sequence[float]) -> bool:
    return all(m == 0 for m in means) and all(s == 1 for s in stds)
