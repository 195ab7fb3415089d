"""Every op captured in a CUDA graph (torch.cuda.graph), forward and backward, and replayed equals
eager. While a graph is captured the ops check no values and wait for nothing (a host wait is
illegal during capture, and a replay could not raise anyway), so bad input is never an error there:
the kernels' guards must keep it inside the tensors. A bad RoI row pools zeros and passes no
gradient; a pixel with a bad depth contributes nothing (README: "Bad input, host waits and CUDA
graphs"). Eager calls still raise, also after a capture."""
import pytest
import torch

from redet_plugin.ops import (depth_flow_projection, riroi_align_rotated,
                              riroi_align_rotated_multilevel, roi_pool)
from redet_plugin.testing import capture

pytestmark = pytest.mark.cuda


def replay(graph, outputs):
    graph.replay()
    torch.cuda.synchronize()  # an illegal access in a replay surfaces here
    return [o.clone() for o in outputs]


def assert_all_close(got, expected):
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------ RoIPool ------------------------------------------
def roi_pool_step(x, rois, grad_output):
    out = roi_pool(x, rois, (3, 2), 0.5)
    (grad,) = torch.autograd.grad(out, x, grad_output)
    return out, grad


def roi_pool_case():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 12, 13, generator=g).cuda().requires_grad_(True)
    rois = torch.tensor([[0, 1.0, 2, 14, 20], [1, 4, 4, 9, 6], [1, -4, 3, 30, 10],
                         [0, 8, 8, 8, 8]]).cuda()
    return x, rois, torch.randn(4, 40, 3, 2, generator=g).cuda()


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_roi_pool_replay_equals_eager(layout):
    x, rois, grad_output = roi_pool_case()
    x = x.detach().contiguous(memory_format=layout).requires_grad_(True)
    graph, outputs = capture(roi_pool_step, x, rois, grad_output)
    expected = roi_pool_step(x, rois, grad_output)
    assert_all_close(replay(graph, outputs), expected)
    with torch.no_grad():  # new values in the static inputs
        x.mul_(-2.0)
        rois[:, 1:] += 1.0
    assert_all_close(replay(graph, outputs), roi_pool_step(x, rois, grad_output))


@pytest.mark.parametrize("column, value", [(0, 7.0), (0, -1.0), (0, 0.5), (0, float("nan")),
                                           (3, float("inf"))])
def test_roi_pool_bad_rows_in_a_graph_pool_zeros_and_pass_no_gradient(column, value):
    x, rois, grad_output = roi_pool_case()
    graph, outputs = capture(roi_pool_step, x, rois, grad_output)
    good = rois.clone()
    rois[2, column] = value  # too late for any check: only the kernels' guards see it
    out, grad = replay(graph, outputs)
    expected_out, _ = roi_pool_step(x, good, grad_output)
    without_row = grad_output.clone()
    without_row[2] = 0
    _, expected_grad = roi_pool_step(x, good, without_row)
    assert out[2].eq(0).all()
    torch.testing.assert_close(out[[0, 1, 3]], expected_out[[0, 1, 3]])
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="rois"):  # eager calls still check
        roi_pool(x, rois, (3, 2), 0.5)


# ------------------------------------- RiRoIAlignRotated -------------------------------------
def riroi_case(num_samples):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2 * 8, 14, 15, generator=g).cuda().requires_grad_(True)
    rois = torch.tensor([[0, 10.0, 12, 9, 6, 0.3], [1, 20, 8, 14, 20, -2.0],
                         [1, -6, 30, 18, 8, 1.0], [0, 28, 28, 3, 2, 3.0]]).cuda()
    step = lambda x, rois, grad_output: riroi_step(x, rois, grad_output, num_samples)  # noqa: E731
    return step, x, rois, torch.randn(4, 16, 3, 3, generator=g).cuda()


def riroi_step(x, rois, grad_output, num_samples):
    out = riroi_align_rotated(x, rois, 3, 0.5, num_samples, 8, clockwise=True)
    (grad,) = torch.autograd.grad(out, x, grad_output)
    return out, grad


@pytest.mark.parametrize("num_samples", [2, 0])  # the fixed-grid and the any-grid kernels
def test_riroi_replay_equals_eager(num_samples):
    step, x, rois, grad_output = riroi_case(num_samples)
    graph, outputs = capture(step, x, rois, grad_output)
    assert_all_close(replay(graph, outputs), step(x, rois, grad_output))
    with torch.no_grad():
        x.mul_(0.5)
        rois[:, 5] += 0.7
    assert_all_close(replay(graph, outputs), step(x, rois, grad_output))


@pytest.mark.parametrize("column, value", [(0, 5.0), (0, 0.5), (1, float("nan")),
                                           (3, float("inf")), (5, float("nan"))])
def test_riroi_bad_rows_in_a_graph_pool_zeros_and_pass_no_gradient(column, value):
    step, x, rois, grad_output = riroi_case(0)  # adaptive grid: inf must not loop ~2^31 times
    graph, outputs = capture(step, x, rois, grad_output)
    good = rois.clone()
    rois[1, column] = value
    out, grad = replay(graph, outputs)
    expected_out, _ = step(x, good, grad_output)
    without_row = grad_output.clone()
    without_row[1] = 0
    _, expected_grad = step(x, good, without_row)
    assert out[1].eq(0).all()
    torch.testing.assert_close(out[[0, 2, 3]], expected_out[[0, 2, 3]])
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="rois"):
        riroi_align_rotated(x, rois, 3, 0.5, 0, 8)


def multilevel_step(features, rois, levels, grad_output):
    out = riroi_align_rotated_multilevel(features, rois, levels, [0.5, 0.25], 3, 2, 8)
    grads = torch.autograd.grad(out, features, grad_output)
    return (out, *grads)


def test_riroi_multilevel_replay_and_bad_level():
    g = torch.Generator().manual_seed(2)
    features = [torch.randn(2, 16, s, s, generator=g).cuda().requires_grad_(True) for s in (16, 8)]
    rois = torch.tensor([[0, 10.0, 12, 9, 6, 0.3], [1, 20, 8, 14, 20, -2.0],
                         [1, 6, 20, 18, 8, 1.0]]).cuda()
    levels = torch.tensor([0, 1, 1]).cuda()
    grad_output = torch.randn(3, 16, 3, 3, generator=g).cuda()
    graph, outputs = capture(multilevel_step, features, rois, levels, grad_output)
    assert_all_close(replay(graph, outputs), multilevel_step(features, rois, levels, grad_output))
    levels[1] = 5  # no such level
    got = replay(graph, outputs)
    without_row = grad_output.clone()
    without_row[1] = 0
    expected = multilevel_step(features, rois, torch.tensor([0, 1, 1]).cuda(), without_row)
    assert got[0][1].eq(0).all()
    assert_all_close(got[1:], expected[1:])
    with pytest.raises(RuntimeError, match=r"levels must be in \[0, 2\); row 1 has 5"):
        riroi_align_rotated_multilevel(features, rois, levels, [0.5, 0.25], 3, 2, 8)


# --------------------------------- depth-aware flow projection ---------------------------------
def flow_step(flow, depth, grad_output, fill):
    out = depth_flow_projection(flow, depth, 0.5, fill)  # check_depth=True: skipped in the graph
    grads = torch.autograd.grad(out, (flow, depth), grad_output)
    return (out, *grads)


def flow_case():
    g = torch.Generator().manual_seed(3)
    flow = (torch.randn(2, 2, 24, 40, generator=g) * 3).cuda().requires_grad_(True)
    depth = (0.5 + torch.rand(2, 1, 24, 40, generator=g)).cuda().requires_grad_(True)
    return flow, depth, torch.randn(2, 2, 24, 40, generator=g).cuda()


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("fill", [False, True])
def test_flow_projection_replay_equals_eager(fill, deterministic):
    flow, depth, grad_output = flow_case()
    torch.use_deterministic_algorithms(deterministic)
    try:
        step = lambda *a: flow_step(*a, fill)  # noqa: E731
        graph, outputs = capture(step, flow, depth, grad_output)
        assert_all_close(replay(graph, outputs), step(flow, depth, grad_output))
        with torch.no_grad():
            flow.mul_(-1.5)
        assert_all_close(replay(graph, outputs), step(flow, depth, grad_output))
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("value", [0.0, -2.0, float("nan")])
def test_flow_projection_bad_depth_in_a_graph_contributes_nothing(value):
    flow, depth, grad_output = flow_case()
    step = lambda *a: flow_step(*a, True)  # noqa: E731
    graph, outputs = capture(step, flow, depth, grad_output)
    with torch.no_grad():
        good_depth = depth.detach().clone()
        depth[1, 0, 5, 7] = value
    got = replay(graph, outputs)
    nan_flow = flow.detach().clone()
    nan_flow[1, :, 5, 7] = float("nan")  # a dropped pixel: what a bad depth must amount to
    expected = step(nan_flow.requires_grad_(True), good_depth.requires_grad_(True), grad_output)
    assert_all_close(got[:1], expected[:1])
    torch.testing.assert_close(got[1], expected[1].nan_to_num(0.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], expected[2], rtol=1e-5, atol=1e-5)
    assert got[2][1, 0, 5, 7] == 0
    with pytest.raises(RuntimeError, match="depth must be > 0"):
        depth_flow_projection(flow, depth, 0.5)
