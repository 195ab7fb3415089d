"""Conversions shared by the ops' Python faces.

They only turn convenient Python inputs into the ops' argument types (an int into an output size
pair, a list of per-image boxes into rois) and reject what cannot be converted. The values are
checked once, at the C++ op boundary, so that torch.ops.redet.* callers get the same errors.
"""
from typing import List, Sequence, Tuple, Union

import torch


def output_size_pair(output_size: Union[int, Sequence[int]], op: str) -> Tuple[int, int]:
    """`7` or `(7, 7)` -> (7, 7); anything else is a TypeError (sizes <= 0 are the op's error)."""
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        return output_size, output_size
    if (isinstance(output_size, (tuple, list)) and len(output_size) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) for s in output_size)):
        return int(output_size[0]), int(output_size[1])
    raise TypeError(f"{op}: output_size must be an int or a pair of ints, got {output_size!r}")


def as_float(value, name: str, op: str) -> float:
    """A Python number (or a one-element tensor, a numpy scalar) as a float."""
    if isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number, got {value!r}") from None


def as_int(value, name: str, op: str) -> int:
    """An int (not a bool, not a float)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be an int, got {value!r}")
    return int(value)


def require_tensors(op: str, **tensors) -> None:
    """A TypeError naming the first argument that is not a tensor (None, a list, an array)."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(value).__name__}")


def level_arguments(op: str, features, rois, levels, spatial_scales) -> List[float]:
    """The multi-level ops' features (a list of tensors), rois, levels (tensors) and
    spatial_scales (a list of numbers, returned as floats): a TypeError naming the first that is
    not what it should be."""
    if not isinstance(features, (list, tuple)):
        raise TypeError(f"{op}: features must be a list of tensors, got "
                        f"{type(features).__name__}")
    require_tensors(op, **{f"features[{i}]": f for i, f in enumerate(features)}, rois=rois,
                    levels=levels)
    if not isinstance(spatial_scales, (list, tuple)):
        raise TypeError(f"{op}: spatial_scales must be a list of numbers (one per level), "
                        f"got {type(spatial_scales).__name__}")
    return [as_float(s, f"spatial_scales[{i}]", op) for i, s in enumerate(spatial_scales)]


def require_one_device(op: str, **tensors: torch.Tensor) -> None:
    """For the fake kernels: a RuntimeError naming the first tensor on another device than the
    first one. Without it a call mixing a meta tensor with real ones would run the fake kernel
    and return uninitialised real memory (the C++ kernels check this themselves)."""
    (first_name, first), *others = tensors.items()
    for name, tensor in others:
        torch._check(tensor.device == first.device,
                     lambda: f"{op}: {name} must be on the device of {first_name} "
                             f"({first.device}), got {tensor.device}")


def check_levels_fake(op: str, features, rois: torch.Tensor, levels: torch.Tensor,
                      ncols: int) -> None:
    """For the multi-level ops' fake kernels: features non-empty, every tensor on one device,
    rois (K, ncols)."""
    torch._check(len(features) > 0, lambda: f"{op}: features must not be empty")
    require_one_device(op, **{f"features[{i}]": f for i, f in enumerate(features)}, rois=rois,
                       levels=levels)
    torch._check(rois.dim() == 2 and rois.shape[1] == ncols,
                 lambda: f"{op}: rois must be (K, {ncols})")


def empty_gradient(like: torch.Tensor, shape, channels_last: bool) -> torch.Tensor:
    """For the backward ops' fake kernels: an input gradient of `shape` with like's dtype and
    device, in the layout the kernels write (channels-last when asked)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device,
                       memory_format=torch.channels_last if channels_last
                       else torch.contiguous_format)


def rois_with_batch_index(rois: Union[torch.Tensor, List[torch.Tensor]], box_dim: int,
                          op: str) -> torch.Tensor:
    """A (K, 1 + box_dim) tensor passes through (the op checks it); a list of per-image
    (Ki, box_dim) boxes becomes that tensor, its first column the image index."""
    if isinstance(rois, torch.Tensor):
        return rois
    if not isinstance(rois, (list, tuple)) or not all(isinstance(b, torch.Tensor) for b in rois):
        raise TypeError(f"{op}: rois must be a tensor or a list of tensors, got "
                        f"{type(rois).__name__}")
    for i, boxes in enumerate(rois):
        if boxes.dim() != 2 or boxes.size(1) != box_dim:
            raise ValueError(f"{op}: rois[{i}] must be a (Ki, {box_dim}) tensor of boxes, got "
                             f"shape {tuple(boxes.shape)}")
    if not rois:
        raise ValueError(f"{op}: rois is an empty list; pass a (0, {box_dim + 1}) tensor for no "
                         "boxes")
    boxes = torch.cat(list(rois), dim=0)
    index = torch.cat([torch.full((len(b), 1), i, dtype=boxes.dtype, device=boxes.device)
                       for i, b in enumerate(rois)], dim=0)
    return torch.cat([index, boxes], dim=1)
