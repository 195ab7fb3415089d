"""Hole filling of the depth-aware flow projection on large holes: a flow that empties half of
the image, a single non-hole, no non-hole at all, holes along every border, bands of holes in
both directions; tiny, wide (many 32-pixel row words on CUDA) and tall (many 32-row column
words) images; B > 1. The linear row/column sweeps must give what the plain
reference gives (tests/test_ops/_reference.py), forward and backward, on CPU and CUDA."""
import pytest
import torch

from redet_plugin.testing import HOLE_KINDS as KINDS, hole_case
from tests._helpers import assert_close_to_scale, flow_tolerance, ours_and_reference_grads
from tests.test_ops._reference import depth_flow_projection_reference

OP = torch.ops.redet.depth_flow_projection.default
# (batch, height, width): tiny, thin, wide (many 32-pixel row words on CUDA), tall (several
# 32-row column words and 32 x 32 tiles per column)
SHAPES = [(3, 1, 1), (1, 2, 67), (2, 64, 1), (1, 33, 33), (2, 21, 700), (1, 300, 45)]
# CUDA: neighbour searches over many 32-row column words, which these narrow images reach cheaply
TALL_SHAPES = [(1, 2100, 3), (2, 4200, 2)]
T = 1.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_large_holes_match_reference(kind, shape):
    """In float64, where the summation order does not matter at this tolerance."""
    flow, depth = hole_case(kind, *shape, seed=len(kind) + shape[2], dtype=torch.float64)
    ours, ref = ours_and_reference_grads(flow, depth, T, True)
    assert_close_to_scale(ours, ref, 1e-9)
    assert torch.equal(ours[1].clamp(max=0), ref[1].clamp(max=0))  # holes, directions found


@pytest.mark.parametrize("kind", KINDS)
def test_large_holes_match_reference_float32(kind):
    flow, depth = hole_case(kind, 2, 21, 700, seed=len(kind))
    ours, ref = ours_and_reference_grads(flow, depth, T, True)
    # (the fill's transpose sums runs of ~350 holes: float32 summation order shows at ~5e-4)
    assert_close_to_scale(ours[:2], ref[:2], 1e-5)
    assert_close_to_scale(ours[2:], ref[2:], 2e-3)


def test_cases_have_the_holes_they_claim():
    """The cases are what their names say (otherwise the tests above test less)."""
    holes = {kind: (depth_flow_projection_reference(*hole_case(kind, 1, 40, 90), T, False)[1] <= 0)[0, 0]
             for kind in KINDS}
    assert holes["half"][:, :40].all() and holes["half"].float().mean() > 0.45
    assert int((~holes["single"]).sum()) in (1, 2, 4) and holes["none"].all()
    for border in (holes["borders"][0], holes["borders"][-1], holes["borders"][:, 0], holes["borders"][:, -1]):
        assert border.all()
    # (the bands' edges may catch a neighbour's noisy landing: look inside them)
    assert holes["bands"][:, 39:72].all() and holes["bands"][25:44].all() and not holes["bands"].all()


def test_single_non_hole_fills_its_row_and_column_only():
    flow, depth = hole_case("single", 1, 9, 11)
    out, count = OP(flow, depth, T, False, True, True)
    projected, _ = OP(flow, depth, T, False, False, True)
    filled = count[0, 0] < 0
    reached = (count[0, 0] != 0)  # a hole with no non-hole in any direction keeps count 0
    assert filled.any() and not reached.all()
    # every filled pixel shares a row or a column with a non-hole
    rows, cols = (count[0, 0] > 0).any(1), (count[0, 0] > 0).any(0)
    assert bool((rows[:, None] | cols[None, :])[reached].all())
    assert bool((out[:, :, ~reached] == 0).all())
    assert torch.equal(out[:, :, count[0, 0] > 0], projected[:, :, count[0, 0] > 0])


@pytest.mark.cuda
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_large_holes_match_cpu_and_reference(kind, dtype, deterministic):
    tol = 1e-9 if dtype == torch.float64 else 2e-3  # (see the float32 test above)
    if deterministic and dtype == torch.float64:
        # fixed-point sums are quantised relative to a worst-case bound of every target's total
        # (csrc/common/fixed_point.h), not to each value: measured up to 5e-9 of the largest value
        tol = 1e-7
    for shape in SHAPES + TALL_SHAPES:
        flow, depth = hole_case(kind, *shape, seed=len(kind) + shape[2], dtype=dtype)
        cpu, ref = ours_and_reference_grads(flow, depth, T, True)
        torch.use_deterministic_algorithms(deterministic)
        try:
            cuda = ours_and_reference_grads(flow.cuda(), depth.cuda(), T, True)[0]
        finally:
            torch.use_deterministic_algorithms(False)
        assert_close_to_scale(cuda, cpu, tol)
        assert_close_to_scale(cuda, ref, tol)
        # the hole structure (count's sign and the directions found) is exact
        assert torch.equal(cuda[1].cpu().clamp(max=0), cpu[1].clamp(max=0)), shape


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
def test_cuda_matches_cpu_with_and_without_fill(fill):
    flow, depth = hole_case("bands", 2, 50, 300)
    out, count = OP(flow.cuda(), depth.cuda(), T, False, fill, True)
    cpu_out, cpu_count = OP(flow, depth, T, False, fill, True)
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(count.cpu(), cpu_count, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_cuda_large_holes_dtypes(dtype):
    flow, depth = hole_case("bands", 2, 40, 260, dtype=dtype)
    cpu = ours_and_reference_grads(flow, depth, T, True)[0]
    cuda = ours_and_reference_grads(flow.cuda(), depth.cuda(), T, True)[0]
    assert_close_to_scale(cuda, cpu, max(2 * flow_tolerance(dtype), 1e-4))


@pytest.mark.cuda
def test_cuda_deterministic_fill_is_bitwise_repeatable():
    flow, depth = hole_case("half", 2, 70, 300, seed=3)
    results = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(3):
            results.append(ours_and_reference_grads(flow.cuda(), depth.cuda(), 0.8, True)[0])
    finally:
        torch.use_deterministic_algorithms(False)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.cuda
def test_cuda_depth_check_still_raises_after_the_fill():
    flow, depth = hole_case("half", 1, 20, 70)
    depth[0, 0, 5, 7] = float("nan")
    with pytest.raises(RuntimeError, match="depth must be > 0.*got nan at flat index 357"):
        OP(flow.cuda(), depth.cuda(), T, False, True, True)
    OP(flow.cuda(), depth.cuda(), T, False, True, False)  # unchecked: runs
    torch.cuda.synchronize()
