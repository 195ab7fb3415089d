"""A whole test forward replayed as one CUDA graph (ReDet's `cuda_graph_predict` option).

The test forward waits for nothing until its last step, the cut of the fixed-size detections
(structures/padded_results.py). Backbone, neck, RPN, proposals, both R-CNN stages and the
NMS are captured once and replayed with one launch per batch; the cut of the replay's padded
results is the one read-back of a batch.

One graph per (input shape and dtype, the metainfo the forward turns into Python numbers,
rescale, grad and inference mode, autocast dtype, TF32 settings, module state), up to
`max_graphs`, all in one memory pool; the first forward of each runs eagerly (lazily built
caches: anchors, the eval-mode filters). Past `max_graphs`, for inputs not on CUDA, with grad
enabled, or after a capture failed, the eager forward runs, with one line naming why. A
replaced parameter, buffer or cached filter makes its graph be captured again.
"""
from typing import List, Optional

import torch
from mmengine.structures import InstanceData
from torch import nn

from ..structures.padded_results import keep_padding
from ..utils.cuda_capture import capture_graph
from ..utils.precision import tf32_settings
from .graph_cache import GraphCache
from .module_walk import ModuleWalk
from .step_graphs import hashable

__all__ = ["PredictGraphs"]

# metainfo that a test forward turns into Python numbers (baked into a graph): box decoding
# and clipping read the image's shape, rescaling its scale factor
PREDICT_META_KEYS = ("img_shape", "pad_shape", "batch_input_shape", "ori_shape", "scale_factor")


class _PredictGraph:
    def __init__(self, model, inputs: torch.Tensor, samples: list, rescale: bool, pool):
        self.inputs = inputs.clone()
        self.graph = torch.cuda.CUDAGraph()
        with keep_padding(), capture_graph(self.graph, pool):
            self.results = _forward(model, self.inputs, samples, rescale)

    def replay(self, inputs: torch.Tensor) -> List[InstanceData]:
        self.inputs.copy_(inputs)
        self.graph.replay()
        # copies: the next replay overwrites the graph's outputs
        return [InstanceData(metainfo=res.metainfo, **{k: v.clone() for k, v in res.items()})
                for res in self.results]


def _forward(model, inputs, samples, rescale):
    """TwoStageDetector.predict up to its results (fixed-size, with `valid`)."""
    x = model.extract_feat(inputs)
    proposals = model.rpn_head.predict(x, samples, rescale=False)
    return model.roi_head.predict(x, proposals, samples, rescale=rescale)


class PredictGraphs(GraphCache):
    """The captured test forwards of one model; `predict` returns None where eager runs.

    Args:
        max_graphs: graphs kept at most (each input shape and image metainfo needs its own).
    """

    option = "cuda_graph_predict"

    def __init__(self, max_graphs: int = 2):
        super().__init__(max_graphs=max_graphs)

    def predict(self, model: nn.Module, inputs: torch.Tensor, samples: list,
                rescale: bool) -> Optional[List[InstanceData]]:
        """The padded results of one batch (cut them with cut_padding), or None: run eager."""
        reason = self.unsupported(inputs, samples)
        if reason is not None:
            self.say_eager(reason, inputs.is_cuda)
            return None
        walk = ModuleWalk(model)
        amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        key = (tuple(inputs.shape), inputs.dtype, inputs.device, bool(rescale),
               torch.is_inference_mode_enabled(), amp, tf32_settings(),
               tuple(tuple(hashable(s.metainfo.get(k)) for k in PREDICT_META_KEYS)
                     for s in samples),
               walk.state_key())
        # (a first eager forward of each key builds the lazy caches: anchors, eval filters)
        graph = self.graph_for(
            key, walk.storage_key(), lambda: ModuleWalk(model).storage_key(), 1,
            "input layouts (shape, image metainfo)",
            f"a test forward: inputs {tuple(inputs.shape)}",
            lambda pool: _PredictGraph(model, inputs, samples, rescale, pool))
        return None if graph is None else graph.replay(inputs)

    def unsupported(self, inputs: torch.Tensor, samples: list) -> Optional[str]:
        if self.failed is not None:
            return self.failed
        if not inputs.is_cuda:
            return "the inputs are not on a CUDA device"
        if torch.is_grad_enabled():
            return "grad is enabled (a test forward runs under torch.no_grad())"
        if any(s.get("proposals", None) is not None for s in samples):
            return "precomputed proposals"
        if torch.cuda.is_current_stream_capturing():
            return "a capture is in progress"
        return None
