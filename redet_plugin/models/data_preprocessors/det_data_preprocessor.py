"""mmdet's DetDataPreprocessor without host work per image beyond the copies, and whose test
batches copy only what the test forward reads.

mmengine's ImgDataPreprocessor swaps the channels with `x[[2, 1, 0], ...]` (the Python list
becomes an index tensor copied from the host, a wait for the GPU on every image of every batch)
and stacks a list of images with mmengine's stack_batch, which works out the padding with small
CPU tensors: on the GPU machine, the main process's largest cost of a captured test step (its
CPU max alone took milliseconds an image under torch.profiler, tools/test.py's loader threads
running beside it). Here the swap is a flip of the channel dimension (the same for 3 channels),
and the padding is computed from the images' shapes as Python numbers, right after the batch is
copied to the device; the images and the padding value are those of mmengine.

mmengine copies the whole batch to the device, data samples included. A test forward reads
their metainfo only (and precomputed `proposals`, where a sample has them), and the evaluator
reads their ground truth back on the host: outside training the data samples stay on the host
unless they hold proposals, which saves two copies of every ground-truth tensor per image.
Everything else is mmdet's.
"""
import math

import torch
import torch.nn.functional as F
from mmdet.models.data_preprocessors import DetDataPreprocessor as MMDetDetDataPreprocessor
from mmdet.registry import MODELS
from mmengine.model import ImgDataPreprocessor

from redet_plugin.utils.registration import register


class _ImageBatch(ImgDataPreprocessor):
    """mmengine's ImgDataPreprocessor.forward (copy to the device, channel swap, float,
    normalisation, padding to pad_size_divisor, stacking) with the swap a flip and the padding
    worked out from the shapes as Python numbers. mmdet's DetDataPreprocessor.forward calls this
    as its super().forward (DetDataPreprocessor below lists it after mmdet's class)."""

    def forward(self, data: dict, training: bool = False) -> dict:
        data = self.cast_data(data)
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)) and inputs and \
                all(isinstance(x, torch.Tensor) for x in inputs):  # pseudo_collate: (C, H, W)s
            batch = self._stacked([self._prepared(x, dim=0) for x in inputs])
        elif isinstance(inputs, torch.Tensor):  # default_collate: (B, C, H, W)
            if inputs.dim() != 4:
                raise ValueError(f'inputs: a batch tensor must be (B, C, H, W); got shape '
                                 f'{tuple(inputs.shape)}')
            batch = self._prepared(inputs, dim=1)
            batch = _padded(batch, self._padded_sizes([batch.shape[2:]]), self.pad_value)
        else:
            raise TypeError(f'inputs: expected a list of (C, H, W) tensors or a (B, C, H, W) '
                            f'tensor; got {type(inputs).__name__}')
        data['inputs'] = batch
        data.setdefault('data_samples', None)
        return data

    def _prepared(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """An image or a batch swapped, as float, normalised (the channels at `dim`), in
        mmengine's order (a float64 model's mean makes float64 inputs, as there)."""
        if self._channel_conversion:
            x = _swapped(x, dim)
        x = x.float()
        if self._enable_normalize:
            if self.mean.shape[0] == 3 and x.shape[dim] != 3:
                raise ValueError(f'inputs: mean and std have 3 values, so each image needs 3 '
                                 f'channels; got shape {tuple(x.shape)}')
            mean, std = (self.mean, self.std) if dim == 0 else (self.mean[None], self.std[None])
            x = (x - mean) / std
        return x

    def _stacked(self, images: list) -> torch.Tensor:
        """mmengine's stack_batch: each image padded at its bottom and right to the largest
        height and width, rounded up to pad_size_divisor, with pad_value."""
        if len({x.dim() for x in images}) != 1:
            raise ValueError(f'inputs: the images of a batch need the same number of '
                             f'dimensions; got shapes {[tuple(x.shape) for x in images]}')
        sizes = self._padded_sizes([x.shape[1:] for x in images])
        return torch.stack([_padded(x, sizes, self.pad_value) for x in images])

    def _padded_sizes(self, shapes: list) -> list:
        """The largest of each trailing size, rounded up to pad_size_divisor."""
        divisor = self.pad_size_divisor
        return [math.ceil(max(sizes) / divisor) * divisor for sizes in zip(*shapes)]


@register(MODELS)
class DetDataPreprocessor(MMDetDetDataPreprocessor, _ImageBatch):
    """Drop-in for mmdet's DetDataPreprocessor (same arguments and results); registered as
    'RedetDetDataPreprocessor'."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._samples_to_device = True

    def forward(self, data: dict, training: bool = False) -> dict:
        self._samples_to_device = training
        try:
            return super().forward(data, training)
        finally:
            self._samples_to_device = True

    def cast_data(self, data):
        if not self._samples_to_device and isinstance(data, dict) and \
                data.get('data_samples') is not None:
            samples = data['data_samples']
            data = self.cast_data({k: v for k, v in data.items() if k != 'data_samples'})
            data['data_samples'] = [self.cast_data(s) if 'proposals' in s else s
                                    for s in samples]
            return data
        return super().cast_data(data)


def _swapped(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.shape[dim] != 3:
        raise ValueError(f'inputs: bgr_to_rgb/rgb_to_bgr swaps 3 channels, got {x.shape[dim]} '
                         f'channels (shape {tuple(x.shape)})')
    return x.flip(dim)


def _padded(x: torch.Tensor, sizes: list, value) -> torch.Tensor:
    """`x` padded at the end of its trailing dimensions to `sizes` (no copy when it fits)."""
    pad = [0] * (2 * len(sizes))
    pad[1::2] = [size - have for size, have in zip(sizes[::-1], x.shape[::-1])]
    return F.pad(x, pad, value=value) if any(pad) else x
