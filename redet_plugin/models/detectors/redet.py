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
from redet_plugin.utils.precision import tf32_matmuls
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
        tf32_predict: on a GPU, run the test forward's float32 matrix products (the R-CNN
            heads' linear layers) in TF32 while cuDNN runs float32 convolutions in TF32
            (torch.backends.cudnn.allow_tf32, torch's default): one precision for the whole
            forward, as the deployed package runs it. False (default): torch's matmul setting
            decides (full float32 by default).
        cuda_graph_features, cuda_graph_step, cuda_graph_predict: CudaGraphDetectorMixin's.
        Other arguments: TwoStageDetector's.
    """

    def __init__(self, *args, channels_last=False, tf32_predict=False, **kwargs):
        super().__init__(*args, **kwargs)
        for name, value in (('channels_last', channels_last), ('tf32_predict', tf32_predict)):
            if not isinstance(value, bool):
                raise TypeError(f'{name}: expected True or False, got {value!r}')
        self.channels_last = channels_last
        self.tf32_predict = tf32_predict

    def predict_matmuls_in_tf32(self, device) -> bool:
        """Whether a test forward on `device` runs its float32 matrix products in TF32 (see
        tf32_predict), with torch's settings as they are now."""
        return (self.tf32_predict and torch.device(device).type == 'cuda'
                and torch.backends.cudnn.allow_tf32)

    def predict(self, batch_inputs: Tensor, batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        with tf32_matmuls(self.predict_matmuls_in_tf32(batch_inputs.device)):
            return super().predict(batch_inputs, batch_data_samples, rescale=rescale)

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
