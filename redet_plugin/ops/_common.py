"""Small helpers shared by the ops' Python faces."""
from typing import List, Sequence, Tuple, Union

import torch


def output_size_pair(output_size: Union[int, Sequence[int]], op: str) -> Tuple[int, int]:
    """`7` or `(7, 7)` -> (7, 7); anything else, or a size <= 0, is a clear error."""
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        size = (output_size, output_size)
    elif (isinstance(output_size, (tuple, list)) and len(output_size) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in output_size)):
        size = (int(output_size[0]), int(output_size[1]))
    else:
        raise ValueError(f"{op}: output_size must be an int or a pair of ints, got {output_size!r}")
    if min(size) <= 0:
        raise ValueError(f"{op}: output_size must be positive, got {output_size!r}")
    return size


def positive_float(value, name: str, op: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{op}: {name} must be a positive finite number, got {value!r}")
    return number


def rois_with_batch_index(rois: Union[torch.Tensor, List[torch.Tensor]], box_dim: int,
                          layout: str, op: str) -> torch.Tensor:
    """Accepts a (K, 1 + box_dim) tensor, or a list of per-image (Ki, box_dim) boxes, and returns
    the (K, 1 + box_dim) tensor whose first column is the image index."""
    if isinstance(rois, torch.Tensor):
        if rois.dim() != 2 or rois.size(1) != box_dim + 1:
            raise ValueError(f"{op}: rois must be a (K, {box_dim + 1}) tensor {layout} or a list "
                             f"of per-image (Ki, {box_dim}) boxes, got shape {tuple(rois.shape)}")
        return rois
    if not isinstance(rois, (list, tuple)) or not all(isinstance(b, torch.Tensor) for b in rois):
        raise TypeError(f"{op}: rois must be a tensor or a list of tensors, got {type(rois).__name__}")
    for i, boxes in enumerate(rois):
        if boxes.dim() != 2 or boxes.size(1) != box_dim:
            raise ValueError(f"{op}: rois[{i}] must be a (Ki, {box_dim}) tensor of boxes, got "
                             f"shape {tuple(boxes.shape)}")
    if not rois:
        raise ValueError(f"{op}: rois is an empty list; pass a (0, {box_dim + 1}) tensor for no boxes")
    boxes = torch.cat(list(rois), dim=0)
    index = torch.cat([torch.full((len(b), 1), i, dtype=boxes.dtype, device=boxes.device)
                       for i, b in enumerate(rois)], dim=0)
    return torch.cat([index, boxes], dim=1)
