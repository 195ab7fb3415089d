"""A compiled package's forward replayed as one CUDA graph.

AOTInductor's runtime launches its few hundred kernels one at a time from the host, so at 1024²
the GPU waits for the launches. The forward has no read-back and outputs of fixed size, so it can
be captured once and replayed for every image: the image is copied into the graph's input and
the outputs are the graph's own tensors, rewritten by the next call (DeployedDetector copies the
valid rows out first).
"""
import warnings

import torch
from torch import Tensor

from ..utils.cuda_capture import capture_graph, on_capture_stream


class GraphedForward:
    """`forward` (one (H, W, 3) uint8 CUDA image to its outputs) captured on its first call and
    replayed after. A capture that fails leaves `forward` eager, with one warning that says why;
    `captured` tells which path runs."""

    def __init__(self, forward, device: torch.device):
        self._forward = forward
        self._device = device
        self._graph = None
        self._input = None
        self._outputs = None
        self._failed = False

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self, pixels: Tensor):
        if self._graph is None and not self._failed:
            self._capture(pixels)
        if self._graph is None:
            return self._forward(pixels)
        self._input.copy_(pixels)
        self._graph.replay()
        return self._outputs

    def _capture(self, pixels: Tensor) -> None:
        self._input = pixels.clone()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self._device):
                with on_capture_stream():
                    # the first run loads the kernels and sizes the workspaces outside the capture
                    self._forward(self._input)
                with capture_graph(graph):
                    self._outputs = self._forward(self._input)
        except RuntimeError as error:
            self._failed = True
            self._input = self._outputs = None
            first = (str(error).strip().splitlines() or [''])[0]
            warnings.warn(f'the package runs without a CUDA graph: its capture failed '
                          f'({type(error).__name__}: {first})', stacklevel=3)
        else:
            self._graph = graph
