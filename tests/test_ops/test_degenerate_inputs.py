"""Degenerate inputs (empty maps, overflowing sizes, non-finite scales, meta tensors ...) for every
op on the CPU: each must raise an error naming the argument, or give the documented result
(nothing outside the tensors is read)."""
import pytest
import torch

from redet_plugin.ops import (depth_flow_projection, riroi_align_rotated,
                              riroi_align_rotated_multilevel, roi_pool, roi_pool_multilevel)

RIROI_ROI = torch.tensor([[0, 2., 2., 3., 3., 0.3]])
POOL_ROI = torch.tensor([[0, 0., 0., 3., 3.]])


@pytest.mark.parametrize("shape", [(1, 8, 0, 5), (1, 8, 5, 0)])
def test_empty_maps_are_named(shape):
    with pytest.raises(RuntimeError, match=r"input must be at least 1 x 1"):
        riroi_align_rotated(torch.randn(shape), RIROI_ROI, 2)
    with pytest.raises(RuntimeError, match=r"input must be at least 1 x 1"):
        roi_pool(torch.randn(shape[:1] + (3,) + shape[2:]), POOL_ROI, 2)
    features = [torch.randn(1, 8, 6, 6), torch.randn(shape)]
    with pytest.raises(RuntimeError, match=r"features\[1\] must be at least 1 x 1"):
        riroi_align_rotated_multilevel(features, RIROI_ROI, torch.tensor([1]), [1.0, 0.5], 2)
    with pytest.raises(RuntimeError, match=r"features\[1\] must be at least 1 x 1"):
        roi_pool_multilevel(features, POOL_ROI, torch.tensor([1]), [1.0, 0.5], 2)


@pytest.mark.parametrize("dtype, roi_size, scale", [
    (torch.float32, 1e38, 4.0),    # the scaled size overflows float to inf: inf - inf samples
    (torch.float32, 5.0, 1e39),    # a finite double scale that is inf as a float
    (torch.float64, 1e308, 10.0),
])
def test_rois_that_overflow_once_scaled_pool_zeros(dtype, roi_size, scale):
    x = torch.randn(1, 8, 6, 6, dtype=dtype, requires_grad=True)
    rois = torch.tensor([[0, 3., 3., roi_size, roi_size, 0.3], [0, 1., 1., 2., 2., 0.]], dtype=dtype)
    out = riroi_align_rotated(x, rois, 2, spatial_scale=scale, num_samples=2)
    assert torch.isfinite(out).all() and out[0].eq(0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0.0, -1.0])
def test_raw_riroi_backward_checks_spatial_scale(scale):
    grad = torch.ones(1, 8, 2, 2)
    with pytest.raises(RuntimeError, match="spatial_scale must be a positive finite number"):
        torch.ops.redet._riroi_align_rotated_backward(grad, RIROI_ROI, scale, 2, 8, False, False,
                                                      1, 8, 6, 6)
    with pytest.raises(RuntimeError, match="spatial_scale must be a positive finite number"):
        torch.ops.redet._riroi_align_rotated_multilevel_backward(
            grad, RIROI_ROI, torch.zeros(1, dtype=torch.long), [1.0, scale], 2, 8, False, False,
            1, 8, [6, 3], [6, 3])


def test_riroi_num_samples_is_bounded():
    x = torch.ones(1, 1, 6, 6)
    with pytest.raises(RuntimeError, match=r"num_samples must be in \[0, 4096\]"):
        riroi_align_rotated(x, RIROI_ROI, 1, num_samples=46341, num_orientations=1)
    out = riroi_align_rotated(x, RIROI_ROI, 1, num_samples=64, num_orientations=1)
    torch.testing.assert_close(out, torch.ones_like(out))


@pytest.mark.parametrize("rois, message", [
    (torch.zeros(4, 2), r"rois must have shape \(K, 5\)"),
    (torch.zeros(4), r"rois must have shape \(K, 5\)"),
    (torch.zeros(4, 5, dtype=torch.float16), r"grad_output must be floating and rois of its dtype"),
])
def test_raw_roi_pool_backward_checks_rois(rois, message):
    grad, argmax = torch.ones(4, 1, 1, 1), torch.zeros(4, 1, 1, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.redet._roi_pool_backward(grad, rois, argmax, 1, 1, 2, 2)


def test_raw_flow_backward_names_the_output_dtype():
    flow, depth = torch.randn(1, 2, 4, 4), torch.rand(1, 1, 4, 4) + 0.5
    output, count = torch.ops.redet.depth_flow_projection(flow, depth, 0.5, False, True, True)
    with pytest.raises(RuntimeError, match="grad_output and output must have the dtype of flow"):
        torch.ops.redet._depth_flow_projection_backward(torch.ones_like(flow), flow, depth,
                                                        output.double(), count, 0.5, False, True)


def test_a_meta_tensor_beside_real_ones_is_named():
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(RuntimeError, match=r"rois must be on the device of input \(cpu\), got meta"):
        roi_pool(x, POOL_ROI.to("meta"), 2)
    with pytest.raises(RuntimeError, match=r"rois must be on the device of input \(cpu\), got meta"):
        riroi_align_rotated(x, RIROI_ROI.to("meta"), 2)
    with pytest.raises(RuntimeError, match=r"depth must be on the device of flow \(cpu\), got meta"):
        depth_flow_projection(torch.randn(1, 2, 4, 4), torch.ones(1, 1, 4, 4, device="meta"))


def test_meta_tensors_alone_still_give_shapes():
    out = roi_pool(torch.randn(1, 8, 6, 6, device="meta"), POOL_ROI.to("meta"), 2)
    assert out.shape == (1, 8, 2, 2) and out.device.type == "meta"


def test_arguments_that_are_not_tensors_are_named():
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(TypeError, match="input must be a tensor, got NoneType"):
        riroi_align_rotated(None, RIROI_ROI, 2)
    with pytest.raises(TypeError, match="input must be a tensor, got NoneType"):
        roi_pool(None, POOL_ROI, 2)
    with pytest.raises(TypeError, match="depth must be a tensor, got list"):
        depth_flow_projection(torch.randn(1, 2, 4, 4), inverse_depth=None, depth=[1.0])
    with pytest.raises(TypeError, match="flow must be a tensor, got list"):
        depth_flow_projection([0.0], torch.ones(1, 1, 4, 4))
    with pytest.raises(TypeError, match="levels must be a tensor, got NoneType"):
        riroi_align_rotated_multilevel([x], RIROI_ROI, None, [1.0], 2)
    with pytest.raises(TypeError, match="spatial_scales must be a list of numbers"):
        riroi_align_rotated_multilevel([x], RIROI_ROI, torch.zeros(1, dtype=torch.long), 1.0, 2)
