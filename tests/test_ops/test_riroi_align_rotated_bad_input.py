"""RiRoIAlignRotated: bad RoIs, arguments and tensors raise an error naming the argument, at the
Python face and at the raw ops; the raw backward ops give rows that break the RoI rules no
gradient."""
import pytest
import torch

from redet_plugin.ops import riroi_align_rotated, riroi_align_rotated_multilevel
from tests._helpers import riroi_call, riroi_case, riroi_levels_case, riroi_raw_backward


@pytest.mark.parametrize("bad_rois, message", [
    (torch.zeros(3, 5, dtype=torch.float64),
     r"rois must have shape \(K, 6\) = \(batch_index, cx, cy, w, h, theta\), got \[3, 5\]"),
    ([torch.zeros(2, 6, dtype=torch.float64)], r"rois\[0\] must be a \(Ki, 5\)"),
    (torch.tensor([[2.0, 5, 5, 4, 4, 0]], dtype=torch.float64), r"batch indices in \[0, 2\).*row 0"),
    (torch.tensor([[-1.0, 5, 5, 4, 4, 0]], dtype=torch.float64), r"batch indices in \[0, 2\)"),
    (torch.tensor([[0.5, 5, 5, 4, 4, 0]], dtype=torch.float64), "integer batch indices"),
    (torch.tensor([[0, 5, 5, 4, 4, float("nan")]], dtype=torch.float64), "NaN or infinite"),
    (torch.tensor([[0, 5, float("inf"), 4, 4, 0]], dtype=torch.float64), "NaN or infinite"),
    (torch.zeros(1, 6), "same dtype as input"),
])


def test_bad_rois_are_named(bad_rois, message):
    with pytest.raises((RuntimeError, ValueError, TypeError), match=message):
        riroi_call(torch.randn(2, 16, 8, 8, dtype=torch.float64), bad_rois)


@pytest.mark.parametrize("kwargs, message", [
    (dict(output_size=0), "output_size must be positive"),
    (dict(output_size=(2, -1)), "output_size must be positive"),
    (dict(spatial_scale=0.0), "spatial_scale must be a positive"),
    (dict(num_samples=-1), r"num_samples must be in \[0, 4096\]"),
    (dict(num_orientations=0), "num_orientations must be >= 1"),
    (dict(num_orientations=3), r"channels of input \(16\) must be a multiple of num_orientations \(3\)"),
])


def test_bad_arguments_are_named(kwargs, message):
    args = dict(output_size=2, spatial_scale=1.0, num_samples=0, num_orientations=8)
    args.update(kwargs)
    with pytest.raises((RuntimeError, ValueError, TypeError), match=message):
        riroi_align_rotated(torch.randn(1, 16, 8, 8), torch.zeros(1, 6), **args)


@pytest.mark.parametrize("args, message", [
    ((0.5, 2, 2, -1, 8, False, False), r"num_samples must be in \[0, 4096\]"),
    ((0.5, 2, 2, 0, 0, False, False), "num_orientations must be >= 1"),
    ((0.5, 0, 2, 0, 8, False, False), "output_size must be positive"),
    ((0.0, 2, 2, 0, 8, False, False), "spatial_scale must be a positive"),
    ((0.5, 2, 2, 0, 5, False, False), r"must be a multiple of num_orientations \(5\)"),
])


def test_the_raw_op_checks_its_arguments(args, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.redet.riroi_align_rotated(torch.randn(1, 16, 8, 8), torch.zeros(1, 6), *args)


# The backward ops do not check the values of rois and levels (they come from the forward, which
# did; on CUDA a check would cost a host wait): their kernels give a row that breaks the rules no
# gradient, without reading or writing out of bounds. Only a raw call can pass one.
BAD_ROW_VALUES = [(0, 2.0), (0, -1.0), (0, 0.5), (0, float("nan")), (1, float("nan")),
                  (3, float("inf")), (5, float("nan"))]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("column, value", BAD_ROW_VALUES)
def test_the_raw_backward_ops_give_bad_rows_no_gradient(device, column, value):
    x, rois = riroi_case(40, torch.float32, n=2, fields=2, nO=4, h=9, w=11, k=5)
    grad = torch.randn(5, 8, 2, 3, generator=torch.Generator().manual_seed(41))
    x, rois, grad = x.to(device), rois.to(device), grad.to(device)
    bad = rois.clone()
    bad[2, column] = value
    without_row = grad.clone()
    without_row[2] = 0
    args = (x.shape, 0.5, 0, 4)  # adaptive grid: an infinite size must not loop ~2^31 times
    expected = riroi_raw_backward(without_row, rois, *args)
    torch.testing.assert_close(riroi_raw_backward(grad, bad, *args), expected)
    levels = torch.zeros(5, dtype=torch.long, device=device)
    got = torch.ops.redet._riroi_align_rotated_multilevel_backward(
        grad, bad, levels, [0.5], 0, 4, False, False, *x.shape[:2], [x.shape[2]], [x.shape[3]])
    torch.testing.assert_close(got[0], expected)
    levels[2] = 1  # a level past the gradients: no gradient either
    got = torch.ops.redet._riroi_align_rotated_multilevel_backward(
        grad, rois, levels, [0.5], 0, 4, False, False, *x.shape[:2], [x.shape[2]], [x.shape[3]])
    torch.testing.assert_close(got[0], expected)


@pytest.mark.parametrize("sizes, message", [
    ((1, 16, 0, 5), r"at least 1 x 1 .* got height 0 and width 5 at level 0"),
    ((1, 16, 4, -2), r"at least 1 x 1 .* got height 4 and width -2 at level 0"),
    ((-1, 16, 4, 4), "batch_size must be >= 0, got -1"),
])


def test_the_raw_backward_ops_check_the_input_sizes(sizes, message):
    grad, rois = torch.ones(1, 16, 2, 2), torch.tensor([[0, 0.0, 0, 4, 4, 0]])
    with pytest.raises(RuntimeError, match=message):  # an empty map has no pixel to address
        torch.ops.redet._riroi_align_rotated_backward(grad, rois, 1.0, 2, 8, False, False, *sizes)
    batch, channels, height, width = sizes
    with pytest.raises(RuntimeError, match=message):
        torch.ops.redet._riroi_align_rotated_multilevel_backward(
            grad, rois, torch.zeros(1, dtype=torch.long), [1.0, 0.5], 2, 8, False, False, batch,
            channels, [height, 3], [width, 3])


def test_the_raw_multilevel_backward_checks_the_level_count():
    grad, rois = torch.ones(1, 16, 2, 2), torch.tensor([[0, 0.0, 0, 4, 4, 0]])
    message = r"one entry per level \(1 to 16 levels\), got 2, 2 and 1"
    with pytest.raises(RuntimeError, match=message):
        torch.ops.redet._riroi_align_rotated_multilevel_backward(
            grad, rois, torch.zeros(1, dtype=torch.long), [1.0], 2, 8, False, False, 1, 16,
            [4, 2], [4, 2])


def test_bad_input_tensor_is_named():
    with pytest.raises(RuntimeError, match=r"input must be a 4-D"):
        riroi_call(torch.randn(16, 8, 8), torch.zeros(1, 6))
    with pytest.raises(RuntimeError, match=r"input must be float16, bfloat16, float32 or float64"):
        riroi_call(torch.zeros(1, 8, 8, 8, dtype=torch.int32), torch.zeros(1, 6, dtype=torch.int32))


def test_bad_multilevel_arguments_are_named():
    features, rois, levels, scales = riroi_levels_case(18)
    with pytest.raises(RuntimeError, match=r"levels must be in \[0, 4\); row 0 has 7"):
        riroi_align_rotated_multilevel(features, rois, torch.full_like(levels, 7), scales, 2)
    with pytest.raises(RuntimeError, match="levels must be int64, got Int"):
        riroi_align_rotated_multilevel(features, rois, levels.int(), scales, 2)
    with pytest.raises(RuntimeError, match=r"levels must have shape \(K,\) = \(24,\)"):
        riroi_align_rotated_multilevel(features, rois, levels[:3], scales, 2)
    with pytest.raises(RuntimeError, match=r"spatial_scales must hold one scale per feature level \(4\), got 2"):
        riroi_align_rotated_multilevel(features, rois, levels, scales[:2], 2)
    with pytest.raises(RuntimeError, match=r"features\[1\] must have the batch size and channels"):
        riroi_align_rotated_multilevel([features[0], features[1][:, :8]], rois, levels % 2,
                                       scales[:2], 2)
    with pytest.raises(RuntimeError, match=r"features\[1\] must have the dtype and device"):
        riroi_align_rotated_multilevel([features[0], features[1].float()], rois, levels % 2,
                                       scales[:2], 2)
    with pytest.raises(RuntimeError, match="features must hold at least one feature map"):
        riroi_align_rotated_multilevel([], rois, levels, [], 2)
    with pytest.raises(TypeError, match="features must be a list of tensors"):
        riroi_align_rotated_multilevel(features[0], rois, levels, scales, 2)
