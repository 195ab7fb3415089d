"""RoIPool on the CPU against the plain reference (tests/test_ops/_reference.py), torchvision's
semantics: forward and backward, autograd, registration, torch.compile, fuzzing, ties and NaN.
Bad input and CUDA: test_roi_pool_bad_input.py, test_roi_pool_cuda.py."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from redet_plugin.ops import RoIPool, roi_pool
from tests._helpers import deterministic_algorithms, roi_pool_case, roi_pool_rois, roi_pool_tolerance
from tests.test_ops._reference import roi_pool_backward_reference, roi_pool_reference

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("output_size", [(2, 2), (3, 5), (7, 7)])
def test_forward_and_backward_match_reference(dtype, output_size):
    x, rois = roi_pool_case(1, dtype)
    x.requires_grad_(True)
    out = roi_pool(x, rois, output_size, spatial_scale=0.5)
    ref, ref_arg = roi_pool_reference(x, rois, output_size, 0.5)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # max pooling copies values exactly
    _, arg = torch.ops.redet.roi_pool(x, rois, 0.5, *output_size)
    assert torch.equal(arg, ref_arg)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_grad = roi_pool_backward_reference(grad, rois, ref_arg, x.shape)
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=roi_pool_tolerance(dtype), atol=roi_pool_tolerance(dtype))


def test_semantics_rounding_malformed_and_empty_bins():
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6)
    rois = torch.tensor([[1, 0.4, 0.6, 2.5, 2.4],   # corners round to (0, 1, 3, 2)
                         [0, 4.0, 4.0, 1.0, 1.0],   # malformed -> 1x1 at (4, 4)
                         [0, 10.0, 10.0, 12.0, 12.0]])  # fully off the map -> empty bins
    out, arg = torch.ops.redet.roi_pool(x, rois, 1.0, 1, 1)
    assert out[0, 0, 0, 0].item() == x[1, 0, 2, 3].item()
    assert out[1, 0, 0, 0].item() == x[0, 0, 4, 4].item() and arg[1, 0, 0, 0].item() == 4 * 6 + 4
    assert out[2].abs().sum().item() == 0 and (arg[2] == -1).all()
    x.requires_grad_(True)
    roi_pool(x, rois[2:], 1).sum().backward()
    assert x.grad.abs().sum().item() == 0  # empty bins pass no gradient (mmcv sends it to (0, 0))


def test_list_of_boxes_equals_tensor_form_and_module():
    x, rois = roi_pool_case(2)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    ordered = torch.cat([rois[rois[:, 0] == i] for i in range(2)])
    module = RoIPool((3, 3), 0.5)
    assert module.output_size == (3, 3) and "output_size=(3, 3)" in repr(module)
    torch.testing.assert_close(module(x, boxes), roi_pool(x, ordered, 3, 0.5))


def test_non_contiguous_inputs():
    x, rois = roi_pool_case(3, c=4)
    x_nc = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last strides
    rois_nc = rois.new_zeros(rois.shape[0], 10)[:, ::2].copy_(rois)
    assert not x_nc.is_contiguous() and not rois_nc.is_contiguous()
    x_nc.requires_grad_(True)
    out = roi_pool(x_nc, rois_nc, 4, 0.5)
    torch.testing.assert_close(out, roi_pool(x, rois, 4, 0.5))
    grad = torch.randn(out.shape[::-1]).permute(3, 2, 1, 0)  # non-contiguous grad_output
    out.backward(grad)
    _, arg = roi_pool_reference(x, rois, (4, 4), 0.5)
    torch.testing.assert_close(x_nc.grad.double(), roi_pool_backward_reference(grad, rois, arg, x.shape),
                               rtol=1e-5, atol=1e-6)


def test_no_rois_gives_empty_output_and_zero_grad():
    x = torch.randn(1, 3, 5, 5, requires_grad=True)
    out = roi_pool(x, torch.zeros(0, 5), 2)
    assert out.shape == (0, 3, 2, 2)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_gradcheck_float64():
    x, rois = roi_pool_case(4, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: roi_pool(inp, rois, (3, 2), 0.5), (x,))


def test_double_backward_gradgradcheck():
    x, rois = roi_pool_case(5, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda inp: roi_pool(inp, rois, (3, 2), 0.5), (x,))


def test_autograd_runs_in_cpp():
    """Autograd of the op and of its backward op (double backward) is registered in C++
    (csrc/roi_pool/roi_pool_autograd.cpp): no Python runs per call."""
    x, rois = roi_pool_case(5, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 3, 2)
    assert out.grad_fn.name() == "torch::autograd::CppNode<redet::(anonymous namespace)::RoIPool>"
    grad = torch.randn_like(out).requires_grad_(True)
    grad_input = torch.ops.redet._roi_pool_backward(grad, rois, arg, *x.shape)
    assert grad_input.grad_fn.name().endswith("::RoIPoolBackward>")


def test_rois_requiring_grad_only_does_not_crash():
    x, rois = roi_pool_case(6)
    rois.requires_grad_(True)
    out = roi_pool(x, rois, 2, 0.5)
    assert out.requires_grad is False or out.grad_fn is not None


def test_opcheck():
    x, rois = roi_pool_case(7, c=2)
    x.requires_grad_(True)
    torch.library.opcheck(torch.ops.redet.roi_pool.default, (x, rois, 0.5, 3, 3))
    grad = torch.randn(rois.shape[0], 2, 3, 3)
    _, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 3, 3)
    torch.library.opcheck(torch.ops.redet._roi_pool_backward.default, (grad, rois, arg, *x.shape))


def test_channels_last_input_gets_a_channels_last_gradient():
    """The input's gradient has the input's layout (the convolution that made a channels-last map
    takes it without a conversion) and the NCHW input's values, through autograd (double backward
    included) and through the raw backward op; the fake kernel gives the same strides."""
    x, rois = roi_pool_case(9, torch.float64, c=4, h=9, w=11, k=7)
    grad = torch.randn(7, 4, 3, 2, dtype=torch.float64)
    grads = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=fmt).requires_grad_(True)
        grads[fmt], = torch.autograd.grad(roi_pool(xl, rois, (3, 2), 0.5), xl, grad)
        assert grads[fmt].is_contiguous(memory_format=fmt)
        assert torch.autograd.gradgradcheck(lambda inp: roi_pool(inp, rois, (3, 2), 0.5), (xl,))
    assert torch.equal(grads[torch.channels_last], grads[torch.contiguous_format])
    _, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 3, 2)
    for channels_last in (False, True):
        torch.library.opcheck(torch.ops.redet._roi_pool_backward.default,
                              (grad, rois, arg, *x.shape, channels_last))


def test_torch_compile_fullgraph():
    x, rois = roi_pool_case(8)
    compiled = torch.compile(lambda a, b: roi_pool(a, b, 3, 0.5) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, rois), roi_pool(x, rois, 3, 0.5) * 2)


def test_backward_is_deterministic():
    x, rois = roi_pool_case(9, k=64, c=8)
    grads = []
    with deterministic_algorithms():
        for _ in range(3):
            xi = x.clone().requires_grad_(True)
            roi_pool(xi, rois, 7, 0.5).backward(torch.ones(64, 8, 7, 7))
            grads.append(xi.grad)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(1, 12), w=st.integers(1, 12),
       k=st.integers(0, 6), ph=st.integers(1, 5), pw=st.integers(1, 5),
       scale=st.sampled_from([0.25, 0.5, 1.0, 1.7]), seed=st.integers(0, 2**31 - 1))


def test_fuzz_against_reference(n, c, h, w, k, ph, pw, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g)
    rois = roi_pool_rois(k, n, max(h, w) / scale, g)
    out = roi_pool(x, rois, (ph, pw), scale)
    ref, _ = roi_pool_reference(x, rois, (ph, pw), scale)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_ties_and_nan_follow_torchvision_rule():
    g = torch.Generator().manual_seed(40)
    x = torch.randint(-2, 3, (2, 3, 12, 13), generator=g).float()  # many ties: the first max wins
    rois = roi_pool_rois(20, 2, 13, g)
    out, arg = torch.ops.redet.roi_pool(x, rois, 1.0, 3, 4)
    ref, ref_arg = roi_pool_reference(x, rois, (3, 4), 1.0)
    assert torch.equal(out, ref) and torch.equal(arg, ref_arg)
    nan = float("nan")
    x = torch.tensor([[[[nan, 1.0, nan], [2.0, nan, 2.0]], [[nan] * 3, [nan] * 3]]])  # (1, 2, 2, 3)
    out, arg = torch.ops.redet.roi_pool(x, torch.tensor([[0, 0., 0, 2, 1]]), 1.0, 1, 1)
    assert out[0, 0].item() == 2.0 and arg[0, 0].item() == 3  # NaN never wins; first of the 2.0s
    assert out[0, 1].item() == torch.finfo(torch.float32).min and arg[0, 1].item() == -1  # all NaN
