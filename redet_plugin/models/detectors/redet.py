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

from ...cuda_graphs import FeatureGraphs, PredictGraphs, StepGraphs
from ..layers.padded_results import cut_unless_kept
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


def _graphs_option(name: str, option, graphs_type, arguments: str):
    if option is False or option is None:
        return None
    if option is True:
        return graphs_type()
    if isinstance(option, dict):
        return graphs_type(**option)
    raise TypeError(f'{name}: expected a bool or a dict of {graphs_type.__name__} arguments '
                    f'({arguments}); got {option!r}')


@register(MODELS)
class ReDet(TwoStageDetector):
    """Two-stage detector with rotated ground truth and rotated predictions.

    Args:
        cuda_graph_features: replay backbone + neck as CUDA graphs on the GPU
            (redet_plugin/cuda_graphs/feature_graphs.py: the same results, less host time per
            step): True, False (default), or a dict of FeatureGraphs arguments (max_graphs,
            warmup).
        cuda_graph_step: replay the whole training step (forward, backward, gradient
            clipping, SGD step) as one CUDA graph (redet_plugin/cuda_graphs/step_graphs.py):
            True, False (default), or a dict of StepGraphs arguments (max_graphs,
            warmup_iters, min_gt_capacity). Steps a graph cannot serve run eagerly, with a
            one-line reason in the log.
        cuda_graph_predict: replay the whole test forward as one CUDA graph
            (redet_plugin/cuda_graphs/predict_graphs.py): True, False (default), or a dict of
            PredictGraphs arguments (max_graphs).
        channels_last: run backbone, neck and heads on channels-last (NHWC) tensors: the
            images are converted once, and cuDNN's convolutions then need no layout conversion
            of their own (which they make for NCHW tensors in fp16 and TF32). False (default):
            NCHW, as mmdet.
        Other arguments: TwoStageDetector's.
    """

    def __init__(self, *args, cuda_graph_features=False, cuda_graph_step=False,
                 cuda_graph_predict=False, channels_last=False, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(channels_last, bool):
            raise TypeError(f'channels_last: expected True or False, got {channels_last!r}')
        self.channels_last = channels_last
        self.feature_graphs = _graphs_option('cuda_graph_features', cuda_graph_features,
                                             FeatureGraphs, 'max_graphs, warmup')
        self.step_graphs = _graphs_option('cuda_graph_step', cuda_graph_step, StepGraphs,
                                          'max_graphs, warmup_iters, min_gt_capacity')
        self.predict_graphs = _graphs_option('cuda_graph_predict', cuda_graph_predict,
                                             PredictGraphs, 'max_graphs')
        self._in_train_step = False

    def predict(self, batch_inputs: Tensor, batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        """TwoStageDetector.predict, replayed as a CUDA graph when cuda_graph_predict is on and
        a graph can serve the batch."""
        results = None
        if self.predict_graphs is not None:
            results = self.predict_graphs.predict(self, batch_inputs, batch_data_samples,
                                                  rescale)
        if results is None:
            return super().predict(batch_inputs, batch_data_samples, rescale=rescale)
        return self.add_pred_to_datasample(batch_data_samples, cut_unless_kept(results))

    def train_step(self, data, optim_wrapper) -> dict:
        """mmengine's BaseModel.train_step, replayed as a CUDA graph when cuda_graph_step is
        on and a graph can serve the batch."""
        if self.step_graphs is None:
            return super().train_step(data, optim_wrapper)
        self._in_train_step = True
        try:
            with optim_wrapper.optim_context(self):
                data = self.data_preprocessor(data, True)
            log_vars = self.step_graphs.train_step(self, data['inputs'], data['data_samples'],
                                                   optim_wrapper)
            if log_vars is not None:
                return log_vars
            with optim_wrapper.optim_context(self):
                losses = self._run_forward(data, mode='loss')
            parsed_losses, log_vars = self.parse_losses(losses)
            optim_wrapper.update_params(parsed_losses)
            # detached: a kept log value would keep this step's autograd graph alive, and with
            # it the parameters' gradient accumulators, made on this stream; a later capture
            # accumulating into them would make this stream wait on the capture (an error)
            return {key: value.detach() for key, value in log_vars.items()}
        finally:
            self._in_train_step = False

    def extract_feat(self, batch_inputs: Tensor) -> tuple:
        if self.channels_last:
            batch_inputs = batch_inputs.contiguous(memory_format=torch.channels_last)
        if self.feature_graphs is not None:
            feats = self.feature_graphs(self.backbone, self.neck if self.with_neck else None,
                                        batch_inputs)
            if feats is not None:
                return feats
        return super().extract_feat(batch_inputs)

    def loss(self, batch_inputs: Tensor, batch_data_samples: SampleList) -> dict:
        if self.step_graphs is not None and not self._in_train_step:
            # e.g. mmengine's DDP wrapper, whose train_step calls the model's forward
            self.step_graphs.say('eager: the model is trained through a wrapper (e.g. '
                                 'distributed data parallel) that does not call '
                                 'ReDet.train_step')
        x = self.extract_feat(batch_inputs)
        proposal_cfg = self.train_cfg.get('rpn_proposal', self.test_cfg.rpn)
        rpn_losses, rpn_results_list = self.rpn_head.loss_and_predict(
            x, _horizontal_rpn_samples(batch_data_samples), proposal_cfg=proposal_cfg)
        losses = {(f'rpn_{k}' if 'loss' in k and 'rpn' not in k else k): v
                  for k, v in rpn_losses.items()}
        losses.update(self.roi_head.loss(x, rpn_results_list, batch_data_samples))
        return losses
