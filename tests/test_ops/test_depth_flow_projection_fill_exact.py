"""Hole filling bit for bit: on projections that are exact in any summation order
(redet_plugin/testing.py: exact_hole_case) the CPU kernel, the plain reference and the CUDA
kernels (atomics or fixed point) must give identical outputs and counts. The CUDA shapes cross
every boundary of the CUDA fill kernels (csrc/depth_flow_projection/cuda/hole_fill_kernels.cuh): partial 32 x 32 tiles,
partial 32-pixel row words and 32-row column words, neighbour searches over many words of a row
or of a column, H = 1, W = 1."""
import pytest
import torch

import redet_plugin.ops  # noqa: F401  (loads the op)
from redet_plugin.testing import exact_hole_case
from tests.test_ops._reference import depth_flow_projection_reference

OP = torch.ops.redet.depth_flow_projection.default
# H in (1, 31, 33, 4097) x W in (1, 33, 100), then: several warps per row (W > 1024), more word
# groups than warps per row (W > 32768), column segments of 2-5 words (H > 1024); the tile marking
# splits each tile among four warps when there are fewer than 8 per multiprocessor (all but the
# last three here on an H200) and gives a tile one warp otherwise (the last three, with full tiles
# in (1, 1100, 1100)); (3, 70, 100) leaves three of the four warps of its last tile row no rows.
CUDA_SHAPES = [(2, h, w) for h in (1, 31, 33, 4097) for w in (1, 33, 100)] + [
    (3, 70, 100), (2, 40, 1025), (1, 9, 2049), (2, 1100, 3), (1, 5000, 40), (2, 2, 33000),
    (1, 1, 70000), (1, 1100, 1100)]


def fill(flow, depth):
    return OP(flow, depth, 1.0, False, True, True)


def assert_identical(ours, expected, what):
    for a, b, name in zip(ours, expected, ("output", "count")):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()), f"{what}: {name} differs"


@pytest.mark.parametrize("shape", [(2, 1, 1), (2, 31, 33), (1, 300, 45), (2, 70, 1025)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cpu_matches_reference_bitwise(shape, dtype):
    """fp16/bf16: the holes are filled from the neighbours' stored 16-bit outputs (the
    projected means, e.g. thirds, are not exact in 16 bits, so unrounded values would differ)."""
    flow, depth = exact_hole_case(*shape, seed=shape[1], dtype=dtype)
    out, count = fill(flow, depth)
    assert_identical((out, count), depth_flow_projection_reference(flow, depth, 1.0, True), shape)
    if shape[1] * shape[2] > 1:  # the case is what it claims: holes and non-holes
        assert bool((count < 0).any()) and bool((count > 0).any())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu_bitwise(dtype):
    for shape in CUDA_SHAPES:
        flow, depth = exact_hole_case(*shape, seed=sum(shape), dtype=dtype)
        assert_identical(fill(flow.cuda(), depth.cuda()), fill(flow, depth), shape)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_deterministic_matches_cpu_float64_bitwise(dtype):
    """Deterministic mode sums in fixed point and fills in double (exact sums here): the CPU's
    float64 result, rounded once to the input's dtype."""
    for shape in CUDA_SHAPES:
        flow, depth = exact_hole_case(*shape, seed=sum(shape), dtype=dtype)
        expected = [x.to(dtype) for x in fill(flow.double(), depth.double())]
        torch.use_deterministic_algorithms(True)
        try:
            ours = fill(flow.cuda(), depth.cuda())
        finally:
            torch.use_deterministic_algorithms(False)
        assert_identical(ours, expected, shape)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_matches_cpu_bitwise(dtype):
    """fp16/bf16 compute in float32 and fill each hole from its neighbours' outputs as stored (16
    bits), on CUDA as on the CPU. (For float16 the off-image flow 10·W + 10 of the widest cases
    is inf: such pixels land nowhere on either device.)"""
    for shape in CUDA_SHAPES:
        flow, depth = exact_hole_case(*shape, seed=sum(shape), dtype=dtype)
        assert_identical(fill(flow.cuda(), depth.cuda()), fill(flow, depth), shape)
