"""ReDet: a two-stage rotated detector (rotation-equivariant backbone + RoI Transformer head).

mmdet's TwoStageDetector does everything except feeding the RPN: its anchors are horizontal, so
it learns the enclosing horizontal boxes of the rotated ground truth, class-agnostic.
Predictions are rotated: pred_instances.bboxes (N, 5) (cx, cy, w, h, theta), le90.
The CUDA-graph options (cuda_graph_features, cuda_graph_step, cuda_graph_predict) come from
CudaGraphDetectorMixin (redet_plugin/cuda_graphs/detector_mixin.py).
"""
import copy

import torch
from mmdet.models.detectors import TwoStageDetector
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import get_box_tensor
from torch import Tensor

from redet_plugin.cuda_graphs import CudaGraphDetectorMixin
from redet_plugin.structures import rbox2hbox
from redet_plugin.utils.registration import register


def _horizontal_rpn_samples(batch_data_samples: SampleList) -> SampleList:
    """Copies of the samples with one class and enclosing horizontal boxes, for the RPN."""
    rpn_samples = copy.deepcopy(batch_data_samples)
    for sample in rpn_samples:
        for field in ('gt_instances', 'ignored_instances'):
            instances = sample.get(field, None)
            if instances is None or 'bboxes' not in instances:
                continue
            boxes = get_box_tensor(instances.bboxes)
            if boxes.size(-1) == 5:
                instances.bboxes = rbox2hbox(boxes)
            if 'labels' in instances:
                instances.labels = torch.zeros_like(instances.labels)
    return rpn_samples


@register(MODELS)
class ReDet(CudaGraphDetectorMixin, TwoStageDetector):
    """Two-stage detector with rotated ground truth and rotated predictions.

    Args:
        channels_last: run backbone, neck and heads on channels-last (NHWC) tensors: the
            images are converted once, and cuDNN's convolutions then need no layout conversion
            of their own (which they make for NCHW tensors in fp16 and TF32). False (default):
            NCHW, as mmdet.
        cuda_graph_features, cuda_graph_step, cuda_graph_predict: CudaGraphDetectorMixin's.
        Other arguments: TwoStageDetector's.
    """

    def __init__(self, *args, channels_last=False, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(channels_last, bool):
            raise TypeError(f'channels_last: expected True or False, got {channels_last!r}')
        self.channels_last = channels_last

    def extract_feat(self, batch_inputs: Tensor) -> tuple:
        if self.channels_last:
            batch_inputs = batch_inputs.contiguous(memory_format=torch.channels_last)
        return super().extract_feat(batch_inputs)

    def loss(self, batch_inputs: Tensor, batch_data_samples: SampleList) -> dict:
        x = self.extract_feat(batch_inputs)
        proposal_cfg = self.train_cfg.get('rpn_proposal', self.test_cfg.rpn)
        rpn_losses, rpn_results_list = self.rpn_head.loss_and_predict(
            x, _horizontal_rpn_samples(batch_data_samples), proposal_cfg=proposal_cfg)
        losses = {(f'rpn_{k}' if 'loss' in k and 'rpn' not in k else k): v
                  for k, v in rpn_losses.items()}
        losses.update(self.roi_head.loss(x, rpn_results_list, batch_data_samples))
        return losses
