"""Depth-aware flow projection (DAIN) with correct gradients, on CPU and CUDA.

Schema, kernels and per-pixel math (depth_flow_projection_math.h): csrc/depth_flow_projection/.
From the flow F0->1 (B, 2, H, W) and the depth D0 (B, 1, H, W) it estimates F_t->0: each pixel y
lands at p = y + t*F(y) and, if p is inside the image, adds -t*F(y) with weight 1/D(y) to the four
integer pixels around p (equal weights, as DAIN; at the image border one pixel may get the same
contribution twice). Each pixel's output is the weighted mean; pixels nothing reached are holes,
filled (when `fill_holes`) with the mean of the nearest non-holes to the left, right, top and
bottom (0 if there are none), by two linear sweeps (rows, then columns),
so its cost does not depend on how large the holes are. Filling is linear in the projected values,
so gradients pass through it and it can be used in training. Gradients flow to `flow` and to the depth; unlike DAIN's
kernel, the depth gradient is right: d out(x)/d w(y) = -(t*F(y) + out(x)) / count(x).

Conventions:
- t = 0: every pixel stays where it is and contributes -0*F, so the result is all zeros, without
  holes, and the gradients are zero.
- A pixel whose flow is NaN/inf lands nowhere and is dropped (like one pushed off the image).
- depth must be > 0 (NaN is an error; +inf gives weight 0); `inverse_depth` (1/D0, what DAIN
  passes) must be finite and >= 0; a pixel reached only by weight 0 is a hole. The values are
  checked unless `check_depth=False`: on the CPU before computing; on CUDA after the kernels are
  enqueued (one host synchronisation, which the GPU never waits for), and not at all while a CUDA
  graph is captured. Unchecked, a pixel with an invalid depth contributes nothing and gets no
  gradient (README: "Bad input, host waits and CUDA graphs"). Other bad input (shapes, dtypes,
  t outside [0, 1]) raises before anything runs.
- float16/bfloat16 inputs are accumulated in float32, and the holes are filled from the stored
  16-bit outputs of their neighbours (on CPU and CUDA alike), so a filled value may differ by
  about one 16-bit ulp from the float32 result rounded once (an ulp of the neighbours' values:
  where they cancel, a filled value near 0 differs by more of its own ulps). Under
  torch.use_deterministic_algorithms(True) the CUDA forward uses order-independent 64-bit
  fixed-point sums; the CPU kernels and the CUDA backward (a gather) are deterministic anyway.
"""
from typing import Optional

import torch
from torch import nn

from .. import _ext
from ._common import as_float, require_one_device, require_tensors

OP = "depth_flow_projection"

if _ext.is_loaded():
    @torch.library.register_fake("redet::depth_flow_projection")
    def _projection_fake(flow, depth, t, inverse_depth=False, fill_holes=True, check_depth=True):
        require_one_device(OP, flow=flow, depth=depth)
        torch._check(flow.dim() == 4 and flow.shape[1] == 2,
                     lambda: f"{OP}: flow must have shape (B, 2, H, W), got {tuple(flow.shape)}")
        count_dtype = torch.float64 if flow.dtype == torch.float64 else torch.float32
        b, _, h, w = flow.shape
        return torch.empty_like(flow, memory_format=torch.contiguous_format), \
            flow.new_empty((b, 1, h, w), dtype=count_dtype)

    @torch.library.register_fake("redet::_depth_flow_projection_backward")
    def _projection_backward_fake(grad, flow, depth, output, count, t, inverse_depth, fill_holes):
        require_one_device("_depth_flow_projection_backward", flow=flow, grad_output=grad,
                           depth=depth, output=output, count=count)
        return (torch.empty_like(flow, memory_format=torch.contiguous_format),
                torch.empty_like(depth, memory_format=torch.contiguous_format))

    # Autograd: csrc/depth_flow_projection/depth_flow_projection_autograd.cpp (in C++, so a call
    # costs no Python round trip).


def depth_flow_projection(flow: torch.Tensor, depth: Optional[torch.Tensor] = None,
                          t: float = 0.5, fill_holes: bool = True, *,
                          inverse_depth: Optional[torch.Tensor] = None,
                          check_depth: bool = True) -> torch.Tensor:
    """Projects the flow F0->1 (B, 2, H, W) to F_t->0 (B, 2, H, W), weighting pixels by 1/depth.

    Give exactly one of `depth` (D0, (B, 1, H, W), > 0) and `inverse_depth` (1/D0, >= 0). Bad
    input raises (see the module docstring for when on CUDA). float16/bfloat16 are computed in
    float32, but holes are filled from the stored 16-bit neighbour outputs, so a filled value may
    differ by about one 16-bit ulp (of the neighbours' values) from the float32 result rounded
    once.
    """
    if (depth is None) == (inverse_depth is None):
        raise ValueError(f"{OP}: give exactly one of depth and inverse_depth")
    given = depth if depth is not None else inverse_depth
    require_tensors(OP, flow=flow, **{"depth" if depth is not None else "inverse_depth": given})
    if not isinstance(fill_holes, bool):
        raise TypeError(f"{OP}: fill_holes must be a bool, got {fill_holes!r}")
    _ext.require(OP, flow, given)
    output, _ = torch.ops.redet.depth_flow_projection(
        flow, given, as_float(t, "t", OP), inverse_depth is not None, fill_holes, bool(check_depth))
    return output


class DepthFlowProjection(nn.Module):
    """nn.Module form of :func:`depth_flow_projection` (registered in mmdet's MODELS as
    'RedetDepthFlowProjection' by the mm layer). forward(flow, depth) or
    forward(flow, inverse_depth=...)."""

    def __init__(self, t: float = 0.5, fill_holes: bool = True, check_depth: bool = True):
        super().__init__()
        self.t = as_float(t, "t", OP)
        if not isinstance(fill_holes, bool):
            raise TypeError(f"{OP}: fill_holes must be a bool, got {fill_holes!r}")
        self.fill_holes = fill_holes
        self.check_depth = bool(check_depth)

    def forward(self, flow: torch.Tensor, depth: Optional[torch.Tensor] = None, *,
                inverse_depth: Optional[torch.Tensor] = None) -> torch.Tensor:
        return depth_flow_projection(flow, depth, self.t, self.fill_holes,
                                     inverse_depth=inverse_depth, check_depth=self.check_depth)

    def extra_repr(self) -> str:
        return f"t={self.t}, fill_holes={self.fill_holes}"
