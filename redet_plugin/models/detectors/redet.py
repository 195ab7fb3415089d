"""ReDet: a two-stage rotated detector (rotation-equivariant backbone + RoI Transformer head).

mmdet's TwoStageDetector does everything except feeding the RPN: its anchors are horizontal, so
it learns the enclosing horizontal boxes of the rotated ground truth, class-agnostic.
Predictions are rotated: pred_instances.bboxes (N, 5) (cx, cy, w, h, theta), le90.
"""
import copy
from typing import Optional

import torch
from mmdet.models.detectors import TwoStageDetector
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import get_box_tensor
from torch import Tensor

from redet_plugin.utils.registration import register

from ...cuda_graphs import FeatureGraphs
from ...structures import rbox2hbox


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


def _feature_graphs(option) -> Optional[FeatureGraphs]:
    if option is False or option is None:
        return None
    if option is True:
        return FeatureGraphs()
    if isinstance(option, dict):
        return FeatureGraphs(**option)
    raise TypeError('cuda_graph_features: expected a bool or a dict of FeatureGraphs arguments '
                    f'(max_graphs, warmup); got {option!r}')


@register(MODELS)
class ReDet(TwoStageDetector):
    """Two-stage detector with rotated ground truth and rotated predictions.

    Args:
        cuda_graph_features: replay backbone + neck as CUDA graphs on the GPU
            (redet_plugin/cuda_graphs/feature_graphs.py: the same results, less host time per
            step): True, False (default), or a dict of FeatureGraphs arguments (max_graphs,
            warmup). Other arguments: TwoStageDetector's.
    """

    def __init__(self, *args, cuda_graph_features=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.feature_graphs = _feature_graphs(cuda_graph_features)

    def extract_feat(self, batch_inputs: Tensor) -> tuple:
        if self.feature_graphs is not None:
            feats = self.feature_graphs(self.backbone, self.neck if self.with_neck else None,
                                        batch_inputs)
            if feats is not None:
                return feats
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
