"""Ground truth padded to a fixed count, for a training step whose shapes never change.

Each image has its own number of gts; a step captured as one CUDA graph needs the same shapes
every time. `pad_gt_instances` appends padding rows up to a fixed capacity and marks the real
rows with `valid`, a (capacity,) bool field. The training path reads it (RedetMaxIoUAssigner,
the R-CNN stages' candidates): padding gts are never assigned and never drawn, so the losses
are those of the real gts alone.

A padding row holds PADDING_BOX_XYWHA (rotated) or PADDING_BOX_XYXY (horizontal, the rotated
one's enclosing box) and zeros in every other field (label 0): a small real box, so that the
coders, IoUs and losses that still see it (with zero weight) stay finite; 0 * inf would be NaN.
Code that fills static buffers itself should use the same constants.

A structure of the low layer: the captured training step (cuda_graphs/) pads, the models read
`valid`.
"""
import torch
from mmdet.structures.bbox import BaseBoxes, get_box_tensor
from mmengine.structures import InstanceData
from torch import Tensor

PADDING_BOX_XYWHA = (2.0, 2.0, 4.0, 4.0, 0.0)  # (cx, cy, w, h, theta), le90
PADDING_BOX_XYXY = (0.0, 0.0, 4.0, 4.0)        # rbox2hbox(PADDING_BOX_XYWHA)


def padding_box(box_dim: int) -> tuple:
    """The padding constant for boxes of `box_dim` values (4: x1 y1 x2 y2, 5: rotated)."""
    if box_dim == 5:
        return PADDING_BOX_XYWHA
    if box_dim == 4:
        return PADDING_BOX_XYXY
    raise ValueError(f'gt.bboxes: expected 4 (x1, y1, x2, y2) or 5 (cx, cy, w, h, theta) '
                     f'values per box, got {box_dim}')


def pad_gt_instances(gt: InstanceData, capacity: int) -> InstanceData:
    """`gt` with padding rows appended up to `capacity` rows and `valid` ((capacity,) bool, True
    for a real gt; an existing `valid` is kept, so padded gts can be padded further).
    bboxes keep their type (a BaseBoxes subclass or a tensor); only shapes are read."""
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
        raise ValueError(f'capacity: expected an int >= 0, got {capacity!r}')
    if 'bboxes' not in gt:
        raise ValueError('gt: expected InstanceData with bboxes')
    count = len(gt)
    if count > capacity:
        raise ValueError(f'capacity: {count} gts do not fit in capacity={capacity}; raise it to '
                         f'at least the largest gt count of an image')
    extra = capacity - count
    fields = dict(gt.items())
    if 'valid' not in fields:
        device = get_box_tensor(gt.bboxes).device
        fields['valid'] = torch.ones(count, dtype=torch.bool, device=device)
    return type(gt)(metainfo=gt.metainfo, **{
        name: _padded_field(name, value, extra) for name, value in fields.items()})


def _padded_field(name: str, value, extra: int):
    if name == 'bboxes':
        boxes = get_box_tensor(value)
        const = padding_box(boxes.shape[-1])
        # column by column from Python numbers: no copy from host memory
        rows = torch.stack([boxes.new_full((extra, ), v) for v in const], dim=1)
        tensor = torch.cat([boxes, rows])
        return type(value)(tensor, clone=False) if isinstance(value, BaseBoxes) else tensor
    if not isinstance(value, Tensor):
        raise TypeError(f'gt.{name}: only tensor fields (and boxes) can be padded, got '
                        f'{type(value).__name__}')
    return torch.cat([value, value.new_zeros((extra, ) + value.shape[1:])])  # label 0, False

