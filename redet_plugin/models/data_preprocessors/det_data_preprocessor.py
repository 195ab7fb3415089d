"""mmdet's DetDataPreprocessor whose BGR -> RGB swap waits for nothing.

mmengine's ImgDataPreprocessor swaps the channels with `x[[2, 1, 0], ...]`: the Python list
becomes an index tensor copied from the host, a wait for the GPU on every image of every
batch. Here the swap is a flip of the channel dimension (the same for 3 channels), done on the
device right after the batch is copied there; everything else is mmdet's.
"""
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor as MMDetDetDataPreprocessor
from mmdet.registry import MODELS

from redet_plugin.utils.registration import register


@register(MODELS)
class DetDataPreprocessor(MMDetDetDataPreprocessor):
    """Drop-in for mmdet's DetDataPreprocessor (same arguments and results); registered as
    'RedetDetDataPreprocessor'."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # mmengine's swap is switched off; cast_data swaps instead
        self._swap_channels, self._channel_conversion = self._channel_conversion, False

    def cast_data(self, data):
        data = super().cast_data(data)
        if not self._swap_channels or not isinstance(data, dict) or 'inputs' not in data:
            return data
        inputs = data['inputs']
        if isinstance(inputs, torch.Tensor):  # a stacked batch (B, C, H, W)
            data['inputs'] = _swapped(inputs, dim=1)
        elif isinstance(inputs, (list, tuple)):  # pseudo_collate: a list of (C, H, W)
            data['inputs'] = [_swapped(x, dim=0) for x in inputs]
        return data


def _swapped(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.shape[dim] != 3:
        raise ValueError(f'inputs: bgr_to_rgb/rgb_to_bgr swaps 3 channels, got {x.shape[dim]} '
                         f'channels (shape {tuple(x.shape)})')
    return x.flip(dim)
