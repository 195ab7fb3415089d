"""Greedy non-maximum suppression with a fixed-size output and no host synchronisation.

Schema and kernels: csrc/nms_keep_mask/. Returns keep, an (N,) bool mask in the input order,
instead of a list of kept indices: its shape does not depend on the data, so the CUDA kernels
never wait for the GPU (the greedy pass runs on the device), the op works under torch.compile
(fullgraph) and inside CUDA graphs, and callers mask instead of indexing.

boxes: (N, 5) rotated (cx, cy, w, h, theta), theta in radians turning the w side from +x towards
+y (mmcv's nms_rotated / box_iou_rotated with clockwise=True, the le90 boxes of
redet_plugin.structures), or (N, 4) horizontal (x1, y1, x2, y2) with mmcv's nms IoU at its
default offset 0 (torchvision's). The rotated IoU is exact polygon clipping; it differs from
mmcv's where mmcv is wrong (a box inside another that shares three of its edges).

Semantics: exactly greedy NMS. Boxes are visited by score, highest first, equal scores in input
order (mmcv leaves that order to an unstable sort); a kept box suppresses every later box with
IoU > iou_threshold and, when labels are given, the same label (boxes of different labels never
suppress each other; mmcv's nms_rotated ignores its labels on CPU and CUDA). A box with a
non-finite value or an area below 1e-14 has IoU 0 with every box. Nothing is read back: boxes
and scores are not checked for NaN.
"""
from typing import Optional

import torch

from .. import _ext
from ._common import as_float, require_one_device, require_tensors

OP = "nms_keep_mask"

if _ext.is_loaded():
    @torch.library.register_fake("redet::nms_keep_mask")
    def _nms_keep_mask_fake(boxes, scores, iou_threshold, labels=None):
        tensors = dict(boxes=boxes, scores=scores)
        if labels is not None:
            tensors["labels"] = labels
        require_one_device(OP, **tensors)
        torch._check(boxes.dim() == 2 and boxes.shape[1] in (4, 5),
                     lambda: f"{OP}: boxes must have shape (N, 5) or (N, 4)")
        return boxes.new_empty((boxes.shape[0],), dtype=torch.bool)


def nms_keep_mask(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
                  labels: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (N,) bool mask of the boxes greedy NMS keeps (see the module docstring).

    boxes (N, 5) rotated or (N, 4) horizontal, scores (N,) of boxes' dtype, labels (N,) int64 or
    None (one class). Bad input raises a RuntimeError naming the argument.
    """
    require_tensors(OP, boxes=boxes, scores=scores)
    if labels is not None:
        require_tensors(OP, labels=labels)
    threshold = as_float(iou_threshold, "iou_threshold", OP)
    _ext.require(OP, boxes, scores, labels)
    return torch.ops.redet.nms_keep_mask(boxes, scores, threshold, labels)
