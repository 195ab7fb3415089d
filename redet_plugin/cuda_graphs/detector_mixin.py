"""The three CUDA-graph options of a two-stage detector, as a mixin.

    @register(MODELS)
    class ReDet(CudaGraphDetectorMixin, TwoStageDetector): ...

adds the config keys `cuda_graph_features` (FeatureGraphs: backbone + neck), `cuda_graph_step`
(StepGraphs: the whole training step) and `cuda_graph_predict` (PredictGraphs: the whole test
forward). Each is True, False (default) or a dict of its class's arguments. Wherever a graph
cannot serve, the detector's own methods run, so the class it is mixed into stays a plain mmdet
detector. The mixin reads mmdet's TwoStageDetector interface (extract_feat, rpn_head, roi_head,
add_pred_to_datasample, data_preprocessor) by name: this layer imports no mmdet model.
"""
from typing import Optional

import torch

from ..structures.padded_results import cut_unless_kept
from .distributed_step import DistributedStep
from .feature_graphs import FeatureGraphs
from .predict_graphs import PredictGraphs
from .step_graphs import StepGraphs

__all__ = ["CudaGraphDetectorMixin"]


def _graphs_option(name: str, option, graphs_type, arguments: str):
    if option is False or option is None:
        return None
    if option is True:
        return graphs_type()
    if isinstance(option, dict):
        return graphs_type(**option)
    raise TypeError(f'{name}: expected a bool or a dict of {graphs_type.__name__} arguments '
                    f'({arguments}); got {option!r}')


class CudaGraphDetectorMixin:
    """Replays a two-stage detector's work as CUDA graphs where the options ask for it.

    Args:
        cuda_graphs: False turns the three options below off, whatever they say (the one switch
            for configs that turn them on: `--cfg-options model.cuda_graphs=False`).
        cuda_graph_features: replay backbone + neck as CUDA graphs on the GPU
            (cuda_graphs/feature_graphs.py: the same results, less host time per step): True,
            False (default), or a dict of FeatureGraphs arguments (max_graphs, warmup).
        cuda_graph_step: replay the whole training step (forward, backward, gradient
            clipping, SGD step) as one CUDA graph (cuda_graphs/step_graphs.py): True, False
            (default), or a dict of StepGraphs arguments (max_graphs, warmup_iters,
            min_gt_capacity). Steps a graph cannot serve run eagerly, with a one-line reason in
            the log.
        cuda_graph_predict: replay the whole test forward as one CUDA graph
            (cuda_graphs/predict_graphs.py): True, False (default), or a dict of PredictGraphs
            arguments (max_graphs).
        Other arguments: the detector's.
    """

    def __init__(self, *args, cuda_graphs=True, cuda_graph_features=False, cuda_graph_step=False,
                 cuda_graph_predict=False, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(cuda_graphs, bool):
            raise TypeError(f'cuda_graphs: expected True or False; got {cuda_graphs!r}')
        if not cuda_graphs:
            cuda_graph_features = cuda_graph_step = cuda_graph_predict = False
        self.feature_graphs: Optional[FeatureGraphs] = _graphs_option(
            'cuda_graph_features', cuda_graph_features, FeatureGraphs, 'max_graphs, warmup')
        self.step_graphs: Optional[StepGraphs] = _graphs_option(
            'cuda_graph_step', cuda_graph_step, StepGraphs,
            'max_graphs, warmup_iters, min_gt_capacity')
        self.predict_graphs: Optional[PredictGraphs] = _graphs_option(
            'cuda_graph_predict', cuda_graph_predict, PredictGraphs, 'max_graphs')
        self._in_train_step = False

    def predict(self, batch_inputs: torch.Tensor, batch_data_samples: list,
                rescale: bool = True) -> list:
        """The detector's predict, replayed as a CUDA graph when cuda_graph_predict is on and a
        graph can serve the batch."""
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
        return self.graph_train_step(data, optim_wrapper)

    def graph_train_step(self, data, optim_wrapper, wrapper=None,
                         distributed: Optional[DistributedStep] = None) -> dict:
        """train_step with cuda_graph_step on; through `wrapper` (a DDP wrapper of this model,
        engine/distributed_data_parallel.py), the eager step runs that wrapper's forward and
        the captured one averages the gradients over `distributed`'s processes."""
        outer = self if wrapper is None else wrapper
        self._in_train_step = True
        try:
            with optim_wrapper.optim_context(outer):
                data = self.data_preprocessor(data, True)
            log_vars = self.step_graphs.train_step(self, data['inputs'], data['data_samples'],
                                                   optim_wrapper, distributed)
            if log_vars is not None:
                return log_vars
            with optim_wrapper.optim_context(outer):
                losses = outer(**data, mode='loss')
            parsed_losses, log_vars = self.parse_losses(losses)
            optim_wrapper.update_params(parsed_losses)
            # detached: a kept log value would keep this step's autograd graph alive, and with
            # it the parameters' gradient accumulators, made on this stream; a later capture
            # accumulating into them would make this stream wait on the capture (an error)
            return {key: value.detach() for key, value in log_vars.items()}
        finally:
            self._in_train_step = False

    def forward(self, inputs: torch.Tensor, data_samples=None, mode: str = 'tensor'):
        if mode == 'loss' and self.step_graphs is not None and not self._in_train_step:
            # e.g. mmengine's DDP wrapper, whose train_step calls the model's forward
            self.step_graphs.say('eager: the model is trained through a wrapper that calls '
                                 f'neither {type(self).__name__}.train_step nor '
                                 'graph_train_step (for several GPUs: '
                                 'model_wrapper_cfg=dict(type=\'RedetDistributedDataParallel\'))')
        return super().forward(inputs, data_samples, mode)

    def extract_feat(self, batch_inputs: torch.Tensor) -> tuple:
        if self.feature_graphs is not None:
            feats = self.feature_graphs(self.backbone, self.neck if self.with_neck else None,
                                        batch_inputs)
            if feats is not None:
                return feats
        return super().extract_feat(batch_inputs)
