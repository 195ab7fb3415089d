"""RoIPool: bad RoIs, arguments and tensors raise an error naming the argument, at the Python face
and at the raw ops; the raw backward op checks the sizes it allocates and gives rows that break
the RoI rules no gradient."""
import pytest
import torch

from redet_plugin.ops import roi_pool
from tests._helpers import roi_pool_case


@pytest.mark.parametrize("sizes, message", [
    ((1, 2, 0, 6), r"at least 1 x 1 .* got height 0 and width 6"),
    ((1, 2, 6, -1), r"at least 1 x 1 .* got height 6 and width -1"),
    ((-1, 2, 6, 6), r"batch_size and channels must be >= 0, got -1"),
])


def test_raw_backward_checks_the_sizes_it_allocates(sizes, message):
    x, rois = roi_pool_case(9, c=2, h=6, w=6)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 2, 2)
    with pytest.raises(RuntimeError, match=message):  # an empty map has no pixel to address
        torch.ops.redet._roi_pool_backward(torch.ones_like(out), rois, arg, *sizes)


def test_raw_backward_skips_argmax_and_batch_indices_outside_the_gradient():
    """Only the raw op can receive these (the forward never makes them): nothing is written outside
    the gradient, and the valid entries still land."""
    x, rois = roi_pool_case(10, c=2, h=6, w=6)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 2, 2)
    grad = torch.ones_like(out)
    expected = torch.ops.redet._roi_pool_backward(grad, rois, arg, *x.shape)
    bad_arg, bad_rois = arg.clone(), rois.clone()
    bad_arg[0, 0, 0, 0] = 6 * 6 + 100
    bad_rois[-1, 0] = 7  # batch index past the gradient's images
    result = torch.ops.redet._roi_pool_backward(grad, bad_rois, bad_arg, *x.shape)
    skipped = torch.zeros_like(expected)
    n0 = int(rois[0, 0])
    if arg[0, 0, 0, 0] >= 0:
        skipped[n0, 0].view(-1)[arg[0, 0, 0, 0]] += 1
    last = arg[-1]
    for c in range(2):
        for index in last[c].flatten().tolist():
            if index >= 0:
                skipped[int(rois[-1, 0]), c].view(-1)[index] += 1
    torch.testing.assert_close(result, expected - skipped)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("column, value", [(0, 7.0), (0, -1.0), (0, 0.5), (0, float("nan")),
                                           (2, float("nan")), (4, float("inf"))])


def test_raw_backward_gives_bad_rows_no_gradient(device, column, value):
    """Rows that break the RoI rules (csrc/common/roi_rows.h) pass no gradient, on both devices."""
    x, rois = roi_pool_case(11, c=2, h=6, w=6)
    x, rois = x.to(device), rois.to(device)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 2, 2)
    grad = torch.ones_like(out)
    without_row = grad.clone()
    without_row[1] = 0
    bad = rois.clone()
    bad[1, column] = value
    torch.testing.assert_close(torch.ops.redet._roi_pool_backward(grad, bad, arg, *x.shape),
                               torch.ops.redet._roi_pool_backward(without_row, rois, arg, *x.shape))


@pytest.mark.parametrize("bad_rois, message", [
    (torch.zeros(3, 4), r"rois must have shape \(K, 5\) = \(batch_index, x1, y1, x2, y2\), got \[3, 4\]"),
    (torch.zeros(3, 5, 1), r"rois must have shape \(K, 5\) .*got \[3, 5, 1\]"),
    ([torch.zeros(2, 5)], r"rois\[0\] must be a \(Ki, 4\)"),
    ("boxes", "rois must be a tensor or a list"),
    (torch.tensor([[2.0, 0, 0, 1, 1]]), r"batch indices in \[0, 2\).*row 0 has 2"),
    (torch.tensor([[-1.0, 0, 0, 1, 1]]), r"batch indices in \[0, 2\)"),
    (torch.tensor([[0.5, 0, 0, 1, 1]]), r"integer batch indices"),
    (torch.tensor([[0, float("nan"), 0, 1, 1]]), "NaN or infinite"),
    (torch.tensor([[0, 0, 0, float("inf"), 1]]), "NaN or infinite"),
    (torch.zeros(1, 5, dtype=torch.float64), "same dtype as input"),
])


def test_bad_rois_are_named(bad_rois, message):
    with pytest.raises((RuntimeError, ValueError, TypeError), match=message):
        roi_pool(torch.randn(2, 3, 8, 8), bad_rois, 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(output_size=0), "output_size must be positive"),
    (dict(output_size=(2, -1)), "output_size must be positive"),
    (dict(output_size=2.5), "output_size must be an int"),
    (dict(output_size=2, spatial_scale=0), "spatial_scale must be a positive"),
    (dict(output_size=2, spatial_scale=float("nan")), "spatial_scale must be a positive"),
])


def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises((RuntimeError, ValueError, TypeError), match=message):
        roi_pool(torch.randn(1, 3, 8, 8), torch.zeros(1, 5), **kwargs)


@pytest.mark.parametrize("args, message", [
    ((torch.tensor([[2.0, 0, 0, 1, 1]]), 1.0, 2, 2), r"batch indices in \[0, 2\).*row 0 has 2"),
    ((torch.tensor([[0, 0, float("nan"), 1, 1]]), 1.0, 2, 2), r"NaN or infinite values \(row 0\)"),
    ((torch.zeros(1, 5), 0.0, 2, 2), "spatial_scale must be a positive finite number, got 0"),
    ((torch.zeros(1, 5), 1.0, 0, 2), r"output_size must be positive, got \(0, 2\)"),
])


def test_the_raw_op_checks_its_arguments(args, message):
    """The checks live at the C++ op boundary: torch.ops callers get the Python face's errors."""
    with pytest.raises(RuntimeError, match=message):
        torch.ops.redet.roi_pool(torch.randn(2, 3, 8, 8), *args)


def test_bad_input_tensor_is_named():
    with pytest.raises(RuntimeError, match=r"input must be a 4-D"):
        roi_pool(torch.randn(3, 8, 8), torch.zeros(1, 5), 2)
    with pytest.raises(RuntimeError, match=r"input must be float16, bfloat16, float32 or float64"):
        roi_pool(torch.zeros(1, 3, 8, 8, dtype=torch.int32), torch.zeros(1, 5, dtype=torch.int32), 2)
