"""RiRoIAlignRotated on the CPU against the plain reference (tests/test_ops/_reference.py):
spatial rules of mmcv / ReDet, continuous orientation interpolation by default, the peer's with
legacy_orientation; the multi-level op; determinism, registration and torch.compile; fuzzing.
Orientation, bad input and CUDA: the test_riroi_align_rotated_*.py files beside this one."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from redet_plugin.ops import RiRoIAlignRotated, riroi_align_rotated_multilevel
from tests._helpers import (RIROI_BACKWARD_ATOL, RIROI_FORWARD_ATOL, riroi_call, riroi_case,
                            riroi_levels_case, riroi_reference, riroi_reference_grad, riroi_rois)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


# ------------------------------------------ correctness ------------------------------------------
@pytest.mark.parametrize("clockwise", [False, True])
@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("num_samples, output_size", [(0, (3, 4)), (2, (7, 7)), (1, (1, 2))])
def test_matches_reference_float64(clockwise, legacy, num_samples, output_size):
    x, rois = riroi_case(1)
    x.requires_grad_(True)
    kwargs = dict(output_size=output_size, num_samples=num_samples, clockwise=clockwise, legacy=legacy)
    out = riroi_call(x, rois, **kwargs)
    torch.testing.assert_close(out, riroi_reference(x, rois, **kwargs), rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(x.grad, riroi_reference_grad(x, rois, grad, **kwargs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_match_reference(dtype):
    x, rois = riroi_case(2, dtype, k=30)
    x.requires_grad_(True)
    out = riroi_call(x, rois, num_samples=0)
    assert out.dtype == dtype
    ref = riroi_reference(x, rois, num_samples=0)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=RIROI_FORWARD_ATOL[dtype])
    grad = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    out.backward(grad)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), riroi_reference_grad(x, rois, grad, num_samples=0),
                               rtol=0, atol=RIROI_BACKWARD_ATOL[dtype])


def test_num_orientations_and_shapes():
    for nO, fields in [(1, 3), (2, 2), (3, 2), (4, 1), (16, 1)]:
        x, rois = riroi_case(3, nO=nO, fields=fields, h=6, w=9, k=5)
        out = riroi_call(x, rois, nO=nO, num_samples=0)
        assert out.shape == (5, nO * fields, 3, 4)
        torch.testing.assert_close(out, riroi_reference(x, rois, nO=nO, num_samples=0), rtol=0, atol=1e-12)


def test_orientation_channels_are_shifted_by_the_angle():
    """A RoI turned by exactly one orientation step reads its fields shifted by one channel."""
    x = torch.randn(1, 8, 9, 9, dtype=torch.float64)
    step = 2 * math.pi / 8
    # A 1-pixel RoI at a pixel centre samples that pixel whatever its angle.
    base = riroi_call(x, torch.tensor([[0, 4.0, 4.0, 1, 1, 0.0]], dtype=torch.float64), 1, 1.0, 1)
    turned = riroi_call(x, torch.tensor([[0, 4.0, 4.0, 1, 1, 3 * step]], dtype=torch.float64), 1, 1.0, 1)
    torch.testing.assert_close(turned.flatten(), base.flatten().roll(3), rtol=0, atol=1e-9)
    torch.testing.assert_close(base.flatten(), x[0, :, 4, 4])


def test_list_of_boxes_module_and_out_size_alias():
    x, rois = riroi_case(4, k=6)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    ordered = torch.cat([rois[rois[:, 0] == i] for i in range(2)])
    module = RiRoIAlignRotated(out_size=3, spatial_scale=0.5, num_samples=2, clockwise=True)
    assert module.output_size == (3, 3)
    assert "clockwise=True" in repr(module) and "legacy_orientation=False" in repr(module)
    torch.testing.assert_close(module(x, boxes), riroi_call(x, ordered, (3, 3), clockwise=True))
    assert RiRoIAlignRotated((2, 5), 0.25).output_size == (2, 5)
    with pytest.raises(ValueError, match="disagree"):
        RiRoIAlignRotated(output_size=3, out_size=4)
    with pytest.raises(TypeError, match="pass output_size"):
        RiRoIAlignRotated()


def test_non_contiguous_inputs():
    x, rois = riroi_case(5, dtype=torch.float32)
    x_nc = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last strides
    rois_nc = rois.new_zeros(rois.shape[0], 12)[:, ::2].copy_(rois)
    assert not x_nc.is_contiguous() and not rois_nc.is_contiguous()
    x_nc.requires_grad_(True)
    out = riroi_call(x_nc, rois_nc)
    torch.testing.assert_close(out, riroi_call(x, rois), rtol=0, atol=0)
    grad = torch.randn(out.shape[::-1]).permute(3, 2, 1, 0)  # non-contiguous grad_output
    out.backward(grad)
    torch.testing.assert_close(x_nc.grad.double(), riroi_reference_grad(x, rois, grad), rtol=0, atol=1e-5)


def test_no_rois_gives_empty_output_and_zero_grad():
    x = torch.randn(1, 8, 5, 5, requires_grad=True)
    out = riroi_call(x, torch.zeros(0, 6))
    assert out.shape == (0, 8, 3, 4)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_gradcheck_and_gradgradcheck_float64():
    x, rois = riroi_case(6, fields=1, nO=4, h=6, w=7, k=4)
    x.requires_grad_(True)
    for legacy in (False, True):
        fn = lambda inp: riroi_call(inp, rois, (2, 3), nO=4, legacy=legacy)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))


def test_autograd_runs_in_cpp():
    """Autograd of both ops and of their backward ops (double backward) is registered in C++
    (csrc/riroi_align_rotated/riroi_align_rotated_autograd.cpp, one Function for all four): no
    Python runs per call."""
    x, rois = riroi_case(6, fields=1, nO=4, h=6, w=7, k=4)
    x.requires_grad_(True)
    prefix = "torch::autograd::CppNode<redet::(anonymous namespace)::"
    out = riroi_call(x, rois, (2, 3), nO=4)
    assert out.grad_fn.name() == prefix + "RiRoIAlignRotated>"
    grad_output = torch.randn_like(out).requires_grad_(True)  # the backward is linear in it
    (grad,) = torch.autograd.grad(out, x, grad_output, create_graph=True)
    assert grad.grad_fn.name() == prefix + "RiRoIAlignRotated>"
    levels = torch.zeros(4, dtype=torch.long)
    out = riroi_align_rotated_multilevel([x], rois, levels, [0.5], (2, 3), 2, 4)
    assert out.grad_fn.name() == prefix + "RiRoIAlignRotated>"
    (grad,) = torch.autograd.grad(out, x, grad_output, create_graph=True)
    assert grad.grad_fn.name() == prefix + "RiRoIAlignRotated>"


def test_rois_requiring_grad_get_none_and_do_not_crash():
    x, rois = riroi_case(7)
    rois.requires_grad_(True)
    out = riroi_call(x, rois)  # only rois require grad (the peer crashes here)
    out.sum().backward()
    assert rois.grad is None
    x.requires_grad_(True)
    riroi_call(x, rois).sum().backward()
    assert rois.grad is None and x.grad is not None


# ------------------------------------------ multi-level ------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multilevel_equals_per_level_calls(dtype):
    features, rois, levels, scales = riroi_levels_case(13, dtype)
    fused_inputs = [f.clone().requires_grad_(True) for f in features]
    loop_inputs = [f.clone().requires_grad_(True) for f in features]
    fused = riroi_align_rotated_multilevel(fused_inputs, rois, levels, scales, (3, 4), 2, 8, True)
    loop = fused.new_zeros(fused.shape)
    for level, (feature, scale) in enumerate(zip(loop_inputs, scales)):
        index = (levels == level).nonzero().flatten()
        loop = loop.index_put((index,), riroi_call(feature, rois[index], (3, 4), scale, 2, 8, True))
    assert torch.equal(fused, loop)
    grad = torch.randn(fused.shape, dtype=torch.float64).to(dtype)
    fused.backward(grad)
    loop.backward(grad)
    for a, b in zip(fused_inputs, loop_inputs):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    assert torch.equal(fused_inputs[3].grad, torch.zeros_like(features[3]))  # not None


def test_multilevel_gradcheck_opcheck_and_compile():
    g = torch.Generator().manual_seed(14)
    features = [torch.randn(2, 4, h, w, generator=g, dtype=torch.float64).requires_grad_(True)
                for h, w in [(6, 5), (3, 3), (2, 2)]]
    scales = [1 / 4, 1 / 8, 1 / 16]
    rois = riroi_rois(6, 2, 6, 1 / 4, g)
    levels = torch.tensor([0, 1, 2, 0, 1, 2])
    fn = lambda *fs: riroi_align_rotated_multilevel(list(fs), rois, levels, scales, 2, 2, 4)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(features))
    assert torch.autograd.gradgradcheck(fn, tuple(features))
    args = (features, rois, levels, scales, 2, 2, 2, 4, False, False)
    torch.library.opcheck(torch.ops.redet.riroi_align_rotated_multilevel.default, args)
    grad = torch.randn(6, 4, 2, 2, dtype=torch.float64)
    backward_args = (grad, rois, levels, scales, 2, 4, False, False, 2, 4,
                     [f.shape[2] for f in features], [f.shape[3] for f in features])
    torch.library.opcheck(torch.ops.redet._riroi_align_rotated_multilevel_backward.default,
                          backward_args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    compiled(*features).sum().backward()


def test_channels_last_features_get_channels_last_gradients():
    """Every level's gradient has the features' layout (the convolutions that made channels-last
    maps take it without a conversion) and the NCHW features' values, single- and multi-level,
    double backward included; the fake kernels give the same strides. Levels of mixed layouts get
    NCHW gradients."""
    g = torch.Generator().manual_seed(18)
    features = [torch.randn(2, 8, h, w, generator=g, dtype=torch.float64)
                for h, w in [(6, 5), (3, 3)]]
    scales, rois, levels = [1 / 4, 1 / 8], riroi_rois(6, 2, 6, 1 / 4, g), torch.tensor([0, 1] * 3)
    grad = torch.randn(6, 8, 2, 2, dtype=torch.float64)
    single = lambda x: riroi_call(x, rois, (2, 2), scales[0], nO=4)  # noqa: E731
    multi = lambda *fs: riroi_align_rotated_multilevel(list(fs), rois, levels, scales, 2, 2, 4)  # noqa: E731
    expected = None
    for fmts in ([torch.contiguous_format] * 2, [torch.channels_last] * 2,
                 [torch.channels_last, torch.contiguous_format]):
        xs = [f.contiguous(memory_format=fmt).requires_grad_(True) for f, fmt in zip(features, fmts)]
        got = torch.autograd.grad(multi(*xs), xs, grad)
        got_single, = torch.autograd.grad(single(xs[0]), xs[0], grad)
        wanted = fmts[0] if fmts[0] == fmts[1] else torch.contiguous_format
        assert all(t.is_contiguous(memory_format=wanted) for t in got)
        assert got_single.is_contiguous(memory_format=fmts[0])
        grads = got + (got_single,)
        expected = expected or grads
        assert all(torch.equal(a, b) for a, b in zip(grads, expected))
        assert torch.autograd.gradgradcheck(multi, tuple(xs))
    for channels_last in (False, True):
        torch.library.opcheck(torch.ops.redet._riroi_align_rotated_multilevel_backward.default,
                              (grad, rois, levels, scales, 2, 4, False, False, 2, 8, [6, 3], [5, 3],
                               channels_last))
        torch.library.opcheck(torch.ops.redet._riroi_align_rotated_backward.default,
                              (grad, rois, scales[0], 2, 4, False, False, 2, 8, 6, 5, channels_last))


# ------------------------------- determinism, registration, compile -------------------------------
def test_cpu_backward_is_bitwise_identical_across_runs_and_thread_counts():
    x, rois = riroi_case(15, dtype=torch.float32, fields=4, h=20, w=20, k=60)
    grad = torch.randn(60, 32, 7, 7)
    threads = torch.get_num_threads()
    results = []
    try:
        for num_threads in (1, 2, 1, 2):
            torch.set_num_threads(num_threads)
            xi = x.clone().requires_grad_(True)
            riroi_call(xi, rois, (7, 7)).backward(grad)
            results.append(xi.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_opcheck():
    x, rois = riroi_case(16, fields=1, h=7, w=8, k=5)
    x.requires_grad_(True)
    for legacy in (False, True):
        torch.library.opcheck(torch.ops.redet.riroi_align_rotated.default,
                              (x, rois, 0.5, 3, 2, 2, 8, True, legacy))
    grad = torch.randn(5, 8, 3, 2, dtype=torch.float64)
    torch.library.opcheck(torch.ops.redet._riroi_align_rotated_backward.default,
                          (grad, rois, 0.5, 2, 8, True, False, *x.shape))


def test_torch_compile_fullgraph():
    x, rois = riroi_case(17)
    x.requires_grad_(True)
    fn = lambda a, b: riroi_call(a, b, (3, 3), clockwise=True) * 2  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(x, rois)
    torch.testing.assert_close(out, fn(x, rois))
    out.sum().backward()
    torch.testing.assert_close(x.grad, riroi_reference_grad(x, rois, torch.full_like(out, 2.0),
                                                            output_size=(3, 3), clockwise=True),
                               rtol=0, atol=1e-12)


# ------------------------------------------ fuzzing ------------------------------------------
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), fields=st.integers(1, 2), nO=st.sampled_from([1, 2, 3, 4, 8]),
       h=st.integers(1, 10), w=st.integers(1, 10), k=st.integers(0, 5), oh=st.integers(1, 4),
       ow=st.integers(1, 4), num_samples=st.integers(0, 3),
       scale=st.sampled_from([0.25, 0.5, 1.0, 1.7]), clockwise=st.booleans(),
       legacy=st.booleans(), seed=st.integers(0, 2**31 - 1))


def test_fuzz_against_reference(n, fields, nO, h, w, k, oh, ow, num_samples, scale, clockwise,
                                legacy, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, fields * nO, h, w, generator=g, dtype=torch.float64, requires_grad=True)
    rois = riroi_rois(k, n, max(h, w), scale, g)
    kwargs = dict(output_size=(oh, ow), scale=scale, num_samples=num_samples, nO=nO,
                  clockwise=clockwise, legacy=legacy)
    out = riroi_call(x, rois, **kwargs)
    torch.testing.assert_close(out, riroi_reference(x, rois, **kwargs), rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(x.grad, riroi_reference_grad(x, rois, grad, **kwargs), rtol=0, atol=1e-12)
