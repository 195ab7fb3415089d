"""RiRoIAlignRotated's CUDA backward against the CPU kernel (run on the GPU machine), through the
raw backward ops: the channels-last scatter (warp per (RoI, channel chunk), lane = channel) over
channel chunks, levels, deterministic (fixed-point) sums and edge cases."""
import contextlib
import math

import pytest
import torch

from tests._helpers import (RIROI_CUDA_BACKWARD_ATOL, RIROI_CUDA_OPTION_CASES, RIROI_ORDER_RTOL,
                            deterministic_algorithms, riroi_case, riroi_raw_backward, riroi_rois)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# CUDA sums by float atomics in any order and rounds once to the dtype; the CPU sums in order and
# rounds once: float16 / bfloat16 may differ by an ulp of the sum.
BACKWARD_RTOL = {**RIROI_ORDER_RTOL, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (fields, nO) -> channel chunks of the scatter: lanes = (32 // nO) * nO (the forward's chunks);
# nO = 40 (> 32) runs the one-thread-per-input scatter
BACKWARD_CHUNK_CASES = [(5, 4), (11, 6), (3, 16), (40, 1), (4, 8), (1, 40)]


def fixed_point_step(bound):
    """The resolution of the deterministic sums (csrc/common/fixed_point.h): 2^-(61 - e) with
    bound < 2^e."""
    return math.ldexp(1.0, math.frexp(bound)[1] - 61)


def assert_backward_close(got, expected, dtype):
    torch.testing.assert_close(got.cpu().double(), expected.double(), rtol=BACKWARD_RTOL[dtype],
                               atol=RIROI_CUDA_BACKWARD_ATOL[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", BACKWARD_CHUNK_CASES)
def test_cuda_backward_chunks_match_cpu(dtype, fields, nO):
    x, rois = riroi_case(30, dtype, nO=nO, fields=fields, h=9, w=12, k=20)
    g = torch.Generator().manual_seed(31)
    for deterministic in (False, True):
        for clockwise, legacy, num_samples, output_size in RIROI_CUDA_OPTION_CASES:
            grad = torch.randn(20, fields * nO, *output_size, generator=g, dtype=torch.float64).to(dtype)
            args = (x.shape, 0.5, num_samples, nO, clockwise, legacy)
            expected = riroi_raw_backward(grad, rois, *args)
            with deterministic_algorithms() if deterministic else contextlib.nullcontext():
                got = riroi_raw_backward(grad.cuda(), rois.cuda(), *args)
            assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
            assert_backward_close(got, expected, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nO, fields", [(4, 5), (6, 11), (8, 4), (40, 1)])
def test_cuda_multilevel_backward_matches_cpu(dtype, nO, fields):
    """Levels of different sizes (one 1 x 1, one without RoIs) in one scratch buffer."""
    g = torch.Generator().manual_seed(32)
    heights, widths, scales = [24, 12, 6, 1], [20, 10, 5, 1], [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    rois = riroi_rois(40, 2, 24, 1 / 4, g, dtype)
    levels = torch.tensor([0, 1, 3] * 13 + [0])  # level 2 gets no RoI
    cases = [(2, False, False), (0, True, False), (2, True, False), (3, False, False),
             (2, False, True), (2, True, True), (3, False, True)]
    for num_samples, deterministic, channels_last in cases:
        grad = torch.randn(40, fields * nO, 7, 7, generator=g, dtype=torch.float64).to(dtype)
        args = (scales, num_samples, nO, True, False, 2, fields * nO, heights, widths, channels_last)
        expected = torch.ops.redet._riroi_align_rotated_multilevel_backward(grad, rois, levels, *args)
        with deterministic_algorithms() if deterministic else contextlib.nullcontext():
            got = torch.ops.redet._riroi_align_rotated_multilevel_backward(
                grad.cuda(), rois.cuda(), levels.cuda(), *args)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        for level, (a, b) in enumerate(zip(got, expected)):
            assert a.shape == b.shape == (2, fields * nO, heights[level], widths[level])
            assert a.is_contiguous(memory_format=layout) and b.is_contiguous(memory_format=layout)
            assert_backward_close(a, b, dtype)
        assert torch.equal(got[2], torch.zeros_like(got[2]))
        assert got[3].abs().sum() > 0  # the 1 x 1 level did receive gradient


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", [(11, 6), (3, 16), (40, 1), (1, 40)])
def test_cuda_deterministic_backward_chunks_are_bitwise_repeatable(dtype, fields, nO):
    x, rois = riroi_case(33, dtype, nO=nO, fields=fields, h=20, w=24, k=200)
    rois = rois.cuda()
    grad = torch.randn(200, fields * nO, 7, 7, device="cuda").to(dtype)
    for num_samples in (2, 0):
        with deterministic_algorithms():
            runs = [riroi_raw_backward(grad, rois, x.shape, num_samples=num_samples, nO=nO)
                    for _ in range(3)]
        assert all(torch.equal(runs[0], r) for r in runs[1:])
        fast = riroi_raw_backward(grad, rois, x.shape, num_samples=num_samples, nO=nO)
        if dtype == torch.float64:  # each contribution is rounded to the fixed-point step
            torch.testing.assert_close(runs[0], fast, rtol=BACKWARD_RTOL[dtype],
                                       atol=64 * fixed_point_step(grad.abs().sum().item()))
        else:
            assert_backward_close(runs[0], fast.cpu(), dtype)


@pytest.mark.cuda
def test_cuda_deterministic_multilevel_backward_is_bitwise_repeatable():
    g = torch.Generator().manual_seed(34)
    rois = riroi_rois(300, 2, 32, 1 / 4, g, torch.float32).cuda()
    levels = torch.randint(0, 3, (300,), generator=g).cuda()
    grad = torch.randn(300, 64, 7, 7, generator=g).cuda()
    args = ([1 / 4, 1 / 8, 1 / 16], 2, 8, True, False, 2, 64, [32, 16, 8], [32, 16, 8])
    with deterministic_algorithms():
        runs = [torch.ops.redet._riroi_align_rotated_multilevel_backward(grad, rois, levels, *args)
                for _ in range(3)]
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@pytest.mark.cuda
def test_cuda_backward_with_more_warps_than_the_grid():
    """K * chunks beyond the grid's warps (32 blocks of 8 warps per SM: 33792 on an H200): the
    grid-stride loop covers every (RoI, chunk)."""
    g = torch.Generator().manual_seed(35)
    rois = riroi_rois(6000, 2, 16, 0.5, g, torch.float32)  # 48000 (RoI, chunk) items
    grad = torch.randn(6000, 256, 2, 2, generator=g)
    expected = riroi_raw_backward(grad, rois, (2, 256, 16, 16), nO=8)
    got = riroi_raw_backward(grad.cuda(), rois.cuda(), (2, 256, 16, 16), nO=8)
    assert_backward_close(got, expected, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_backward_edge_cases(dtype):
    """K = 0 and off-map RoIs give zero gradients; 1 x 1 maps take every tap on their pixel."""
    grad = torch.randn(2, 20, 3, 4, dtype=torch.float64).to(dtype)
    off_map = torch.tensor([[0, 100., 100, 8, 8, 0.4], [1, -60, 3, 10, 4, -2.0]], dtype=dtype)
    on_tiny = torch.tensor([[0, 0.5, 0.5, 3, 2, 0.7], [1, 2, 1, 40, 40, 3.0]], dtype=dtype)
    for deterministic in (False, True):
        with deterministic_algorithms() if deterministic else contextlib.nullcontext():
            for num_samples in (2, 0):
                empty = riroi_raw_backward(grad[:0].cuda(), off_map[:0].cuda(), (2, 20, 6, 7),
                                           num_samples=num_samples, nO=4)
                assert torch.equal(empty, torch.zeros_like(empty))
                off = riroi_raw_backward(grad.cuda(), off_map.cuda(), (2, 20, 6, 7),
                                         num_samples=num_samples, nO=4)
                assert torch.equal(off, torch.zeros_like(off))
                tiny = riroi_raw_backward(grad.cuda(), on_tiny.cuda(), (2, 20, 1, 1),
                                          num_samples=num_samples, nO=4)
                expected = riroi_raw_backward(grad, on_tiny, (2, 20, 1, 1), num_samples=num_samples, nO=4)
                assert_backward_close(tiny, expected, dtype)
