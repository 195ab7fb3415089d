"""mmdet's DetDataPreprocessor whose BGR -> RGB swap waits for nothing, and whose test batches
copy only what the test forward reads.

mmengine's ImgDataPreprocessor swaps the channels with `x[[2, 1, 0], ...]`: the Python list
becomes an index tensor copied from the host, a wait for the GPU on every image of every
batch. Here the swap is a flip of the channel dimension (the same for 3 channels), done on the
device right after the batch is copied there.

mmengine copies the whole batch to the device, data samples included. A test forward reads
their metainfo only (and precomputed `proposals`, where a sample has them), and the evaluator
reads their ground truth back on the host: outside training the data samples stay on the host
unless they hold proposals, which saves two copies of every ground-truth tensor per image.
Everything else is mmdet's.
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
