"""SingleImageForward: a detector's whole test forward of one fixed-size image as one nn.Module,
tensors in and out, so that torch.export can trace it (redet_plugin/inference/export.py).

In: (H, W, 3) uint8 BGR, as cv2.imread gives. Inside: what the config's data preprocessor does
(BGR -> RGB when it says so, mean/std, zero padding to its size divisor), then the fixed-size
path of the test forward that cuda_graph_predict also captures (keep_padding: the R-CNN head's
detections are max_per_img rows, valid first). Out: boxes (N, 5) float32 le90 in the image's
pixels, scores (N,) float32, labels (N,) int64, count () int64 (the valid rows).
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..structures.padded_results import keep_padding


class SingleImageForward(nn.Module):
    """Args:
        model: a two-stage detector in eval mode (ReDet), with its data_preprocessor.
        image_size: (H, W) of the images it takes.
        half: the model under fp16 autocast (the normalisation and the outputs stay float32).
    """

    def __init__(self, model: nn.Module, image_size: Tuple[int, int], half: bool = False):
        super().__init__()
        self.model = model
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.half = bool(half)
        preprocessor = model.data_preprocessor
        self.bgr_to_rgb = bool(getattr(preprocessor, '_swap_channels',
                                       getattr(preprocessor, '_channel_conversion', False)))
        if getattr(preprocessor, '_enable_normalize', True):
            mean, std = preprocessor.mean.detach().float(), preprocessor.std.detach().float()
        else:
            mean, std = torch.zeros(3), torch.ones(3)
        self.register_buffer('mean', mean.reshape(1, -1, 1, 1).clone(), persistent=False)
        self.register_buffer('std', std.reshape(1, -1, 1, 1).clone(), persistent=False)
        divisor = int(getattr(preprocessor, 'pad_size_divisor', 1) or 1)
        self.pad_value = float(getattr(preprocessor, 'pad_value', 0))
        height, width = self.image_size
        self.padded_size = (-(-height // divisor) * divisor, -(-width // divisor) * divisor)
        self.metainfo = dict(img_shape=self.image_size, ori_shape=self.image_size,
                             pad_shape=self.padded_size, batch_input_shape=self.padded_size,
                             scale_factor=(1.0, 1.0))

    def normalized(self, image: Tensor) -> Tensor:
        """(H, W, 3) uint8 BGR -> (1, 3, H', W') float32 as the data preprocessor makes it."""
        x = image.permute(2, 0, 1).unsqueeze(0).float()
        if self.bgr_to_rgb:
            x = x.flip(1)
        x = (x - self.mean) / self.std
        pad_h, pad_w = self.padded_size[0] - self.image_size[0], self.padded_size[1] - self.image_size[1]
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h), value=self.pad_value)
        return x

    def forward(self, image: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        from mmdet.structures import DetDataSample
        from mmdet.structures.bbox import get_box_tensor
        samples = [DetDataSample(metainfo=dict(self.metainfo))]
        inputs = self.normalized(image)
        with keep_padding(), torch.autocast(image.device.type, torch.float16, enabled=self.half):
            feats = self.model.extract_feat(inputs)
            proposals = self.model.rpn_head.predict(feats, samples, rescale=False)
            result = self.model.roi_head.predict(feats, proposals, samples, rescale=True)[0]
        boxes = get_box_tensor(result.bboxes).float().reshape(-1, 5)
        return boxes, result.scores.float(), result.labels.long(), result.valid.sum()
