"""RiRoIAlignRotated against the plain reference (tests/test_ops/_reference.py): spatial rules of
mmcv / ReDet, continuous orientation interpolation by default, the peer's with legacy_orientation."""
import contextlib
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from redet_plugin.ops import (RiRoIAlignRotated, riroi_align_rotated,
                              riroi_align_rotated_multilevel)
from tests._helpers import deterministic_mode
from tests.test_ops._reference import riroi_align_rotated_reference as reference

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Measured max |error| against the float64 reference on the same (rounded) inputs, outputs and
# gradients of scale 2-4 (5 seeds, CPU): forward / backward float32 1.3e-6 / 1.6e-6 (the float
# geometry's rounding), float16 4.9e-4 / 1.5e-3, bfloat16 3.9e-3 / 8.7e-3 (the output's own
# rounding dominates; sums are accumulated in float32).
FORWARD_ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
BACKWARD_ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
# CUDA vs CPU (and fixed-point vs float atomics) differ by summation order (relative slack), and
# CUDA contracts the sample-coordinate arithmetic into FMAs: a sample that lands within an ulp of
# the peer's (discontinuous) border rule can flip, so float32 gets a little absolute slack too.
ORDER_RTOL = {torch.float64: 1e-7, torch.float32: 2e-5, torch.float16: 0, torch.bfloat16: 0}
CUDA_FORWARD_ATOL = {**FORWARD_ATOL, torch.float32: 5e-5}
# CUDA's backward sums by float atomics in any order; where hundreds of terms of size ~1 cancel,
# fp32 differed from the CPU's in-order sum by up to 1.2e-5 on an H200
CUDA_BACKWARD_ATOL = {**BACKWARD_ATOL, torch.float32: 5e-5}


def random_rois(num_rois, num_images, map_size, scale, generator, dtype=torch.float64):
    """Rotated RoIs in image coordinates: centres up to 20% off the map, sizes from sub-pixel to
    1.5x the map, angles in [-2pi, 2pi)."""
    g = generator
    extent = map_size / scale
    batch = torch.randint(0, num_images, (num_rois, 1), generator=g).double()
    centre = torch.rand(num_rois, 2, generator=g, dtype=torch.float64) * extent * 1.4 - extent * 0.2
    size = torch.rand(num_rois, 2, generator=g, dtype=torch.float64) ** 2 * extent * 1.5
    theta = (torch.rand(num_rois, 1, generator=g, dtype=torch.float64) * 4 - 2) * math.pi
    return torch.cat([batch, centre, size, theta], dim=1).to(dtype)


def make_case(seed, dtype=torch.float64, n=2, fields=2, nO=8, h=13, w=17, k=12, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, fields * nO, h, w, generator=g, dtype=torch.float64).to(dtype)
    return x, random_rois(k, n, max(h, w), scale, g, dtype)


def call(x, rois, output_size=(3, 4), scale=0.5, num_samples=2, nO=8, clockwise=False, legacy=False):
    return riroi_align_rotated(x, rois, output_size, scale, num_samples, nO, clockwise, legacy)


def call_reference(x, rois, output_size=(3, 4), scale=0.5, num_samples=2, nO=8, clockwise=False,
                   legacy=False):
    return reference(x, rois, output_size, scale, num_samples, nO, clockwise, legacy)


def reference_grad(x, rois, grad, **kwargs):
    xr = x.detach().double().requires_grad_(True)
    if rois.shape[0] == 0:
        return torch.zeros_like(xr)
    call_reference(xr, rois, **kwargs).backward(grad.double())
    return xr.grad


# ------------------------------------------ correctness ------------------------------------------
@pytest.mark.parametrize("clockwise", [False, True])
@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("num_samples, output_size", [(0, (3, 4)), (2, (7, 7)), (1, (1, 2))])
def test_matches_reference_float64(clockwise, legacy, num_samples, output_size):
    x, rois = make_case(1)
    x.requires_grad_(True)
    kwargs = dict(output_size=output_size, num_samples=num_samples, clockwise=clockwise, legacy=legacy)
    out = call(x, rois, **kwargs)
    torch.testing.assert_close(out, call_reference(x, rois, **kwargs), rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(x.grad, reference_grad(x, rois, grad, **kwargs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_match_reference(dtype):
    x, rois = make_case(2, dtype, k=30)
    x.requires_grad_(True)
    out = call(x, rois, num_samples=0)
    assert out.dtype == dtype
    ref = call_reference(x, rois, num_samples=0)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=FORWARD_ATOL[dtype])
    grad = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    out.backward(grad)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), reference_grad(x, rois, grad, num_samples=0),
                               rtol=0, atol=BACKWARD_ATOL[dtype])


def test_num_orientations_and_shapes():
    for nO, fields in [(1, 3), (2, 2), (3, 2), (4, 1), (16, 1)]:
        x, rois = make_case(3, nO=nO, fields=fields, h=6, w=9, k=5)
        out = call(x, rois, nO=nO, num_samples=0)
        assert out.shape == (5, nO * fields, 3, 4)
        torch.testing.assert_close(out, call_reference(x, rois, nO=nO, num_samples=0), rtol=0, atol=1e-12)


def test_orientation_channels_are_shifted_by_the_angle():
    """A RoI turned by exactly one orientation step reads its fields shifted by one channel."""
    x = torch.randn(1, 8, 9, 9, dtype=torch.float64)
    step = 2 * math.pi / 8
    # A 1-pixel RoI at a pixel centre samples that pixel whatever its angle.
    base = call(x, torch.tensor([[0, 4.0, 4.0, 1, 1, 0.0]], dtype=torch.float64), 1, 1.0, 1)
    turned = call(x, torch.tensor([[0, 4.0, 4.0, 1, 1, 3 * step]], dtype=torch.float64), 1, 1.0, 1)
    torch.testing.assert_close(turned.flatten(), base.flatten().roll(3), rtol=0, atol=1e-9)
    torch.testing.assert_close(base.flatten(), x[0, :, 4, 4])


def test_list_of_boxes_module_and_out_size_alias():
    x, rois = make_case(4, k=6)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    ordered = torch.cat([rois[rois[:, 0] == i] for i in range(2)])
    module = RiRoIAlignRotated(out_size=3, spatial_scale=0.5, num_samples=2, clockwise=True)
    assert module.output_size == (3, 3)
    assert "clockwise=True" in repr(module) and "legacy_orientation=False" in repr(module)
    torch.testing.assert_close(module(x, boxes), call(x, ordered, (3, 3), clockwise=True))
    assert RiRoIAlignRotated((2, 5), 0.25).output_size == (2, 5)
    with pytest.raises(ValueError, match="disagree"):
        RiRoIAlignRotated(output_size=3, out_size=4)
    with pytest.raises(TypeError, match="pass output_size"):
        RiRoIAlignRotated()


def test_non_contiguous_inputs():
    x, rois = make_case(5, dtype=torch.float32)
    x_nc = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last strides
    rois_nc = rois.new_zeros(rois.shape[0], 12)[:, ::2].copy_(rois)
    assert not x_nc.is_contiguous() and not rois_nc.is_contiguous()
    x_nc.requires_grad_(True)
    out = call(x_nc, rois_nc)
    torch.testing.assert_close(out, call(x, rois), rtol=0, atol=0)
    grad = torch.randn(out.shape[::-1]).permute(3, 2, 1, 0)  # non-contiguous grad_output
    out.backward(grad)
    torch.testing.assert_close(x_nc.grad.double(), reference_grad(x, rois, grad), rtol=0, atol=1e-5)


def test_no_rois_gives_empty_output_and_zero_grad():
    x = torch.randn(1, 8, 5, 5, requires_grad=True)
    out = call(x, torch.zeros(0, 6))
    assert out.shape == (0, 8, 3, 4)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_gradcheck_and_gradgradcheck_float64():
    x, rois = make_case(6, fields=1, nO=4, h=6, w=7, k=4)
    x.requires_grad_(True)
    for legacy in (False, True):
        fn = lambda inp: call(inp, rois, (2, 3), nO=4, legacy=legacy)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))


def test_autograd_runs_in_cpp():
    """Autograd of both ops and of their backward ops (double backward) is registered in C++
    (csrc/riroi_align_rotated/riroi_align_rotated_autograd.cpp, one Function for all four): no
    Python runs per call."""
    x, rois = make_case(6, fields=1, nO=4, h=6, w=7, k=4)
    x.requires_grad_(True)
    prefix = "torch::autograd::CppNode<redet::(anonymous namespace)::"
    out = call(x, rois, (2, 3), nO=4)
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
    x, rois = make_case(7)
    rois.requires_grad_(True)
    out = call(x, rois)  # only rois require grad (the peer crashes here)
    out.sum().backward()
    assert rois.grad is None
    x.requires_grad_(True)
    call(x, rois).sum().backward()
    assert rois.grad is None and x.grad is not None


# ------------------------------------ orientation: continuity ------------------------------------
def _outputs_around_boundaries(legacy, nO=8, eps=1e-4):
    """Largest change of the output when theta crosses k * 2pi / nO by +-eps, k = -nO..nO."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 2 * nO, 24, 24, generator=g, dtype=torch.float64)
    thetas = [k * 2 * math.pi / nO for k in range(-nO, nO + 1)]
    worst = 0.0
    for theta in thetas:
        below, above = (torch.tensor([[0, 12.0, 12.0, 10.0, 7.0, theta + d]], dtype=torch.float64)
                        for d in (-eps, eps))
        change = (call(x, below, 3, 1.0, nO=nO, legacy=legacy)
                  - call(x, above, 3, 1.0, nO=nO, legacy=legacy)).abs().max().item()
        worst = max(worst, change)
    return worst, x.abs().max().item()


def test_output_is_continuous_across_orientation_boundaries():
    worst, _ = _outputs_around_boundaries(legacy=False)
    assert worst < 100 * 1e-4  # O(eps): the spatial grid turns by 2e-4 rad, nothing jumps


def test_legacy_orientation_jumps_like_the_peer():
    worst, _ = _outputs_around_boundaries(legacy=True)
    assert worst > 0.3  # jumps by two channels' difference


def test_default_equals_legacy_where_the_neighbour_weight_is_zero():
    x, _ = make_case(9)
    step = 2 * math.pi / 8
    rois = torch.tensor([[0, 10.0, 12.0, 9.0, 14.0, k * step] for k in range(-3, 4)],
                        dtype=torch.float64)
    torch.testing.assert_close(call(x, rois), call(x, rois, legacy=True), rtol=0, atol=1e-9)


# ---------------------------------- orientation: rotation invariance ----------------------------------
def _equivariant_pair(seed, fields=3, size=21):
    """Features F of an image and F' of the image rotated by 90 degrees (torch.rot90, k=1) about
    the map centre, exactly equivariant for nO = 4: F' = rot90 of F with every field's channels
    cycled by one (F'[c*4 + o] = rot90(F[c*4 + o - 1]))."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(1, fields * 4, size, size, generator=g, dtype=torch.float64)
    rotated = torch.rot90(f.view(1, fields, 4, size, size).roll(1, dims=2), 1, dims=(-2, -1))
    return f, rotated.reshape(f.shape)


def _rotate_roi(roi, size):
    """roi (cx, cy, w, h, theta) after torch.rot90(k=1) of a size x size map: the centre moves to
    (cy, size - 1 - cx); the RoI turns by -pi/2 in the op's angle convention when clockwise=True."""
    b, cx, cy, w, h, theta = roi
    return [b, cy, size - 1 - cx, w, h, theta - math.pi / 2]


@pytest.mark.parametrize("legacy", [False, True])
def test_rotation_invariance_holds_with_clockwise_true(legacy):
    size = 21
    f, f_rotated = _equivariant_pair(10, size=size)
    g = torch.Generator().manual_seed(11)
    rois = random_rois(20, 1, size, 1.0, g).tolist()
    rotated = torch.tensor([_rotate_roi(r, size) for r in rois], dtype=torch.float64)
    rois = torch.tensor(rois, dtype=torch.float64)
    ours = call(f, rois, 3, 1.0, nO=4, clockwise=True, legacy=legacy)
    theirs = call(f_rotated, rotated, 3, 1.0, nO=4, clockwise=True, legacy=legacy)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9)


def test_rotation_invariance_fails_with_clockwise_false():
    """With clockwise=False the RoI would have to turn by +pi/2, and the output comes out cycled
    by two channels: the convention matters."""
    size = 21
    f, f_rotated = _equivariant_pair(12, size=size)
    roi = [0, 10.0, 10.0, 9.0, 5.0, 0.3]
    turned = [0, 10.0, 10.0, 9.0, 5.0, 0.3 + math.pi / 2]
    ours = call(f, torch.tensor([roi], dtype=torch.float64), 3, 1.0, nO=4)
    theirs = call(f_rotated, torch.tensor([turned], dtype=torch.float64), 3, 1.0, nO=4)
    assert (ours - theirs).abs().max() > 0.1
    cycled = ours.view(1, 3, 4, 3, 3).roll(-2, dims=2).reshape(ours.shape)
    torch.testing.assert_close(cycled, theirs, rtol=0, atol=1e-9)


# ------------------------------------------ multi-level ------------------------------------------
def _levels_case(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    sizes = [(24, 20), (12, 10), (6, 5), (3, 3)]
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    features = [torch.randn(2, 16, h, w, generator=g, dtype=torch.float64).to(dtype) for h, w in sizes]
    rois = random_rois(24, 2, 24, 1 / 4, g, dtype)
    levels = torch.randint(0, 3, (24,), generator=g)  # level 3 gets no RoI
    return features, rois, levels, scales


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multilevel_equals_per_level_calls(dtype):
    features, rois, levels, scales = _levels_case(13, dtype)
    fused_inputs = [f.clone().requires_grad_(True) for f in features]
    loop_inputs = [f.clone().requires_grad_(True) for f in features]
    fused = riroi_align_rotated_multilevel(fused_inputs, rois, levels, scales, (3, 4), 2, 8, True)
    loop = fused.new_zeros(fused.shape)
    for level, (feature, scale) in enumerate(zip(loop_inputs, scales)):
        index = (levels == level).nonzero().flatten()
        loop = loop.index_put((index,), call(feature, rois[index], (3, 4), scale, 2, 8, True))
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
    rois = random_rois(6, 2, 6, 1 / 4, g)
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


# ------------------------------- determinism, registration, compile -------------------------------
def test_cpu_backward_is_bitwise_identical_across_runs_and_thread_counts():
    x, rois = make_case(15, dtype=torch.float32, fields=4, h=20, w=20, k=60)
    grad = torch.randn(60, 32, 7, 7)
    threads = torch.get_num_threads()
    results = []
    try:
        for num_threads in (1, 2, 1, 2):
            torch.set_num_threads(num_threads)
            xi = x.clone().requires_grad_(True)
            call(xi, rois, (7, 7)).backward(grad)
            results.append(xi.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_opcheck():
    x, rois = make_case(16, fields=1, h=7, w=8, k=5)
    x.requires_grad_(True)
    for legacy in (False, True):
        torch.library.opcheck(torch.ops.redet.riroi_align_rotated.default,
                              (x, rois, 0.5, 3, 2, 2, 8, True, legacy))
    grad = torch.randn(5, 8, 3, 2, dtype=torch.float64)
    torch.library.opcheck(torch.ops.redet._riroi_align_rotated_backward.default,
                          (grad, rois, 0.5, 2, 8, True, False, *x.shape))


def test_torch_compile_fullgraph():
    x, rois = make_case(17)
    x.requires_grad_(True)
    fn = lambda a, b: call(a, b, (3, 3), clockwise=True) * 2  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(x, rois)
    torch.testing.assert_close(out, fn(x, rois))
    out.sum().backward()
    torch.testing.assert_close(x.grad, reference_grad(x, rois, torch.full_like(out, 2.0),
                                                      output_size=(3, 3), clockwise=True),
                               rtol=0, atol=1e-12)


# ------------------------------------------ bad inputs ------------------------------------------
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
        call(torch.randn(2, 16, 8, 8, dtype=torch.float64), bad_rois)


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
# gradient. Only a raw call can pass one (a NaN coordinate once made the CPU kernel write out of
# bounds).
BAD_ROW_VALUES = [(0, 2.0), (0, -1.0), (0, 0.5), (0, float("nan")), (1, float("nan")),
                  (3, float("inf")), (5, float("nan"))]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("column, value", BAD_ROW_VALUES)
def test_the_raw_backward_ops_give_bad_rows_no_gradient(device, column, value):
    x, rois = make_case(40, torch.float32, n=2, fields=2, nO=4, h=9, w=11, k=5)
    grad = torch.randn(5, 8, 2, 3, generator=torch.Generator().manual_seed(41))
    x, rois, grad = x.to(device), rois.to(device), grad.to(device)
    bad = rois.clone()
    bad[2, column] = value
    without_row = grad.clone()
    without_row[2] = 0
    args = (x.shape, 0.5, 0, 4)  # adaptive grid: an infinite size must not loop ~2^31 times
    expected = raw_backward(without_row, rois, *args)
    torch.testing.assert_close(raw_backward(grad, bad, *args), expected)
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
    with pytest.raises(RuntimeError, match=message):  # an empty map once crashed the kernels
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
        call(torch.randn(16, 8, 8), torch.zeros(1, 6))
    with pytest.raises(RuntimeError, match=r"input must be float16, bfloat16, float32 or float64"):
        call(torch.zeros(1, 8, 8, 8, dtype=torch.int32), torch.zeros(1, 6, dtype=torch.int32))


def test_bad_multilevel_arguments_are_named():
    features, rois, levels, scales = _levels_case(18)
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
    rois = random_rois(k, n, max(h, w), scale, g)
    kwargs = dict(output_size=(oh, ow), scale=scale, num_samples=num_samples, nO=nO,
                  clockwise=clockwise, legacy=legacy)
    out = call(x, rois, **kwargs)
    torch.testing.assert_close(out, call_reference(x, rois, **kwargs), rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(x.grad, reference_grad(x, rois, grad, **kwargs), rtol=0, atol=1e-12)


# ---------------------------------- CUDA (run on the GPU machine) ----------------------------------
@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nO", [8, 4, 3])
def test_cuda_matches_cpu(dtype, nO):
    x, rois = make_case(20, dtype, nO=nO, fields=3, h=30, w=40, k=80)
    for clockwise, legacy, num_samples in [(False, False, 2), (True, True, 0), (True, False, 1)]:
        kwargs = dict(output_size=(7, 7), nO=nO, num_samples=num_samples, clockwise=clockwise,
                      legacy=legacy)
        xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
        out_cpu, out_cuda = call(xc, rois, **kwargs), call(xg, rois.cuda(), **kwargs)
        torch.testing.assert_close(out_cuda.cpu().double(), out_cpu.double(), rtol=ORDER_RTOL[dtype],
                                   atol=CUDA_FORWARD_ATOL[dtype])
        grad = torch.randn(out_cpu.shape, dtype=torch.float64).to(dtype)
        out_cpu.backward(grad)
        out_cuda.backward(grad.cuda())
        torch.testing.assert_close(xg.grad.cpu().double(), xc.grad.double(), rtol=ORDER_RTOL[dtype],
                                   atol=CUDA_BACKWARD_ATOL[dtype])


@CUDA
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_multilevel_equals_per_level_calls(dtype):
    features, rois, levels, scales = _levels_case(21, dtype)
    features = [f.cuda() for f in features]
    rois, levels = rois.cuda(), levels.cuda()
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        try:
            fused_inputs = [f.clone().requires_grad_(True) for f in features]
            loop_inputs = [f.clone().requires_grad_(True) for f in features]
            fused = riroi_align_rotated_multilevel(fused_inputs, rois, levels, scales, 7, 2)
            loop = fused.new_zeros(fused.shape)
            for level, (feature, scale) in enumerate(zip(loop_inputs, scales)):
                index = (levels == level).nonzero().flatten()
                loop = loop.index_put((index,), call(feature, rois[index], 7, scale, 2))
            assert torch.equal(fused, loop)
            grad = torch.randn_like(fused)
            fused.backward(grad)
            loop.backward(grad)
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            for a, b in zip(fused_inputs, loop_inputs):
                torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=tol)
            assert torch.equal(fused_inputs[3].grad, torch.zeros_like(features[3]))
        finally:
            torch.use_deterministic_algorithms(False)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_deterministic_backward_is_bitwise_repeatable(dtype):
    x, rois = make_case(22, dtype, fields=4, h=30, w=40, k=300)
    x, rois = x.cuda(), rois.cuda()
    grad = torch.randn(300, 32, 7, 7, device="cuda").to(dtype)
    results = []
    with deterministic_mode():
        for _ in range(3):
            xi = x.clone().requires_grad_(True)
            call(xi, rois, 7, num_samples=0).backward(grad)
            results.append(xi.grad)
    assert all(torch.equal(results[0], r) for r in results[1:])
    xi = x.clone().requires_grad_(True)
    call(xi, rois, 7, num_samples=0).backward(grad)  # fast (atomic) path agrees to rounding
    # float64: each term added in 64-bit fixed point is rounded to 2^-61 of the sum's bound (about
    # 1e-14 here); hundreds of them differed from the float atomics by 1.3e-12 on an H200
    atol = 1e-11 if dtype == torch.float64 else CUDA_BACKWARD_ATOL[dtype]
    torch.testing.assert_close(results[0].double(), xi.grad.double(), rtol=ORDER_RTOL[dtype],
                               atol=atol)


@CUDA
def test_cuda_gradcheck_opcheck_and_compile():
    x, rois = make_case(23, fields=1, nO=4, h=6, w=7, k=4)
    x, rois = x.cuda().requires_grad_(True), rois.cuda()
    assert torch.autograd.gradcheck(lambda inp: call(inp, rois, (2, 3), nO=4), (x,))
    torch.library.opcheck(torch.ops.redet.riroi_align_rotated.default,
                          (x, rois, 0.5, 3, 2, 2, 4, True, False))
    compiled = torch.compile(lambda a: call(a, rois, 3, nO=4), fullgraph=True)
    torch.testing.assert_close(compiled(x), call(x, rois, 3, nO=4))


@CUDA
def test_cuda_errors_are_named():
    x = torch.randn(2, 16, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="batch indices"):
        call(x, torch.tensor([[5.0, 4, 4, 2, 2, 0]], device="cuda"))
    with pytest.raises(RuntimeError, match="same device"):
        call(x, torch.zeros(1, 6))


@CUDA
@pytest.mark.parametrize("bad_value, message", [
    (float("nan"), r"NaN or infinite values \(row 2\)"),
    (float("inf"), r"NaN or infinite values \(row 2\)"),  # adaptive grid: must not loop ~2^31 times
])
def test_cuda_bad_rois_raise_after_the_kernels_ran(bad_value, message):
    # The CUDA check is read back after the kernels are enqueued: they must skip the bad row safely
    # (no illegal access, no hang), the error must name it, and the device must stay usable.
    x = torch.randn(2, 16, 8, 8, device="cuda")
    rois = torch.tensor([[0.0, 4, 4, 3, 2, 0.3]] * 4, device="cuda")
    for column in (1, 3, 5):
        bad = rois.clone()
        bad[2, column] = bad_value
        with pytest.raises(RuntimeError, match=message):
            call(x, bad, num_samples=0)
    features, level_rois, levels, scales = _levels_case(18)
    features = [f.cuda() for f in features]
    with pytest.raises(RuntimeError, match=r"levels must be in \[0, 4\); row 0 has 7"):
        riroi_align_rotated_multilevel(features, level_rois.cuda(), torch.full_like(levels, 7).cuda(),
                                       scales, 2)
    torch.cuda.synchronize()
    torch.testing.assert_close(call(x, rois).cpu(), call(x.cpu(), rois.cpu()), rtol=1e-4, atol=1e-5)


@CUDA
@pytest.mark.parametrize("clockwise", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_legacy_orientation_equals_mmcv(clockwise, dtype):
    mmcv_ops = pytest.importorskip("mmcv.ops")
    x, rois = make_case(24, dtype, fields=4, h=40, w=50, k=200, scale=0.25)
    x, rois = x.cuda(), rois.cuda()
    for output_size, num_samples in [((7, 7), 2), ((3, 5), 0)]:
        peer = mmcv_ops.RiRoIAlignRotated(output_size, 0.25, num_samples, 8, clockwise)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = riroi_align_rotated(a, rois, output_size, 0.25, num_samples, 8, clockwise, True)
        theirs = peer(b, rois)
        grad = torch.randn_like(ours)
        ours.backward(grad)
        theirs.backward(grad)
        if dtype == torch.float64:
            assert (ours - theirs).abs().max().item() <= 1e-12
            assert (a.grad - b.grad).abs().max().item() <= 1e-12
        else:
            assert ((ours - theirs).abs().max() / theirs.abs().max()).item() <= 1e-5
            assert ((a.grad - b.grad).abs().max() / b.grad.abs().max()).item() <= 1e-5
        # the default differs from the peer only through the peer's neighbour channel
        fixed = riroi_align_rotated(x, rois, output_size, 0.25, num_samples, 8, clockwise)
        torch.testing.assert_close(fixed.cpu(), call(x.cpu(), rois.cpu(), output_size, 0.25,
                                                     num_samples, 8, clockwise),
                                   rtol=ORDER_RTOL[dtype], atol=FORWARD_ATOL[dtype])


# --------------------- CUDA channels-last forward: chunks, layouts, edge cases ---------------------
# (fields, nO) -> channel chunks of the warp-per-(RoI, chunk) kernel: lanes = (32 // nO) * nO.
CHUNK_CASES = [
    (4, 8),    # C = 32: one full chunk (4 groups)
    (5, 4),    # C = 20: one chunk, 12 idle lanes
    (11, 6),   # C = 66: 30-lane chunks 30 + 30 + 6, 2 lanes past every chunk
    (3, 16),   # C = 48: 32 + 16
    (2, 32),   # C = 64: one group per warp
    (40, 1),   # C = 40: no orientation interpolation, 32 + 8
    (1, 40),   # nO > 32: the NCHW kernel
]
# (clockwise, legacy, num_samples, output_size): both kernel instantiations (fixed 2 x 2 grid and
# any grid) and both orientation modes.
CUDA_OPTION_CASES = [(False, False, 2, (7, 7)), (True, True, 0, (3, 4)), (True, False, 1, (2, 5)),
                     (False, True, 3, (1, 1)), (True, True, 2, (6, 7))]


def channels_last(x):
    return x.contiguous(memory_format=torch.channels_last)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", CHUNK_CASES)
def test_cuda_chunks_match_cpu_for_both_layouts(dtype, fields, nO):
    x, rois = make_case(25, dtype, nO=nO, fields=fields, h=9, w=12, k=20)
    xg, rois_g = x.cuda(), rois.cuda()
    for clockwise, legacy, num_samples, output_size in CUDA_OPTION_CASES:
        kwargs = dict(output_size=output_size, nO=nO, num_samples=num_samples,
                      clockwise=clockwise, legacy=legacy)
        expected = call(x, rois, **kwargs)
        nchw = call(xg, rois_g, **kwargs)
        nhwc = call(channels_last(xg), rois_g, **kwargs)
        assert nhwc.is_contiguous() and nhwc.shape == expected.shape
        assert torch.equal(nhwc, nchw)  # one kernel, one layout after the transpose
        torch.testing.assert_close(nchw.cpu().double(), expected.double(), rtol=ORDER_RTOL[dtype],
                                   atol=CUDA_FORWARD_ATOL[dtype])


@CUDA
def test_cuda_channels_last_gradient_equals_nchw_gradient():
    x, rois = make_case(26, torch.float32, nO=6, fields=11, h=9, w=12, k=20)
    a = x.cuda().clone().requires_grad_(True)
    b = channels_last(x.cuda()).detach().requires_grad_(True)
    grad = torch.randn(20, 66, 3, 4, device="cuda")
    call(a, rois.cuda(), nO=6).backward(grad)
    call(b, rois.cuda(), nO=6).backward(grad)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-6)  # float atomics' order


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_edge_cases(dtype):
    """K = 0, RoIs entirely off the map (zeros), a 1 x 1 map, a RoI covering the whole map."""
    g = torch.Generator().manual_seed(27)
    x = torch.randn(2, 20, 6, 7, generator=g, dtype=torch.float64).to(dtype)
    for layout in (lambda t: t, channels_last):
        xg = layout(x.cuda())
        empty = call(xg, torch.zeros(0, 6, dtype=dtype, device="cuda"), nO=4)
        assert empty.shape == (0, 20, 3, 4) and empty.dtype == dtype
        off_map = torch.tensor([[0, 100., 100, 8, 8, 0.4], [1, -60, 3, 10, 4, -2.0]], dtype=dtype)
        out = call(xg, off_map.cuda(), nO=4)
        assert torch.equal(out, torch.zeros_like(out))
        rois = torch.tensor([[0, 0.5, 0.5, 3, 2, 0.7], [1, 2, 1, 40, 40, 3.0],
                             [1, 6, 7, 30, 20, -5.0]], dtype=dtype)
        tiny = x[:, :, :1, :1].contiguous()  # 1 x 1 maps: every tap reads the one pixel
        for features in (x, tiny):
            for num_samples in (2, 0):
                expected = call(features, rois, (3, 4), 0.5, num_samples, 4)
                got = call(layout(features.cuda()), rois.cuda(), (3, 4), 0.5, num_samples, 4)
                torch.testing.assert_close(got.cpu().double(), expected.double(),
                                           rtol=ORDER_RTOL[dtype], atol=CUDA_FORWARD_ATOL[dtype])


# The forward splits a RoI's bins into parts of <= 32 per warp (49 -> 25 + 24, 33 -> 17 + 16,
# 64 -> 32 + 32, 81 -> 3 x 27), and the fixed 2 x 2 grid takes a part's bins two at a time out of
# passes of 8: 1, 9, 15 and 25 bins end a pass with a single bin (its partner reads off-map taps).
FIXED_GRID_SIZES = [(1, 1), (1, 2), (3, 3), (5, 3), (4, 4), (6, 7), (7, 7), (11, 3), (8, 8), (9, 9)]


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", [(4, 8), (11, 6), (5, 4), (3, 16), (40, 1)])
def test_cuda_bin_parts_and_steps_match_cpu(dtype, fields, nO):
    x, rois = make_case(29, dtype, nO=nO, fields=fields, h=11, w=9, k=24)
    xg, rois_g = x.cuda(), rois.cuda()
    for index, output_size in enumerate(FIXED_GRID_SIZES):
        num_samples = 2 if index % 3 else 0  # the any-grid kernel splits its bins the same way
        kwargs = dict(output_size=output_size, nO=nO, num_samples=num_samples, clockwise=True)
        expected = call(x, rois, **kwargs)
        nchw = call(xg, rois_g, **kwargs)
        assert torch.equal(call(channels_last(xg), rois_g, **kwargs), nchw)
        torch.testing.assert_close(nchw.cpu().double(), expected.double(), rtol=ORDER_RTOL[dtype],
                                   atol=CUDA_FORWARD_ATOL[dtype])


@CUDA
@pytest.mark.skipif(not torch.cuda.is_available() or
                    torch.cuda.get_device_properties(0).total_memory < 24 * 2**30,
                    reason="needs a GPU with 24 GB")
def test_cuda_fixed_grid_falls_back_for_images_over_4gb():
    """The fixed grid addresses an image by 32-bit byte offsets: an image of more than 4 GB takes
    the any-grid kernel, which must give the same values (RoIs well inside a corner read the same
    pixels as on that corner cropped out)."""
    g = torch.Generator(device="cuda").manual_seed(30)
    side = 16500  # 2 channels x 16500^2 pixels x 8 bytes = 4.36e9 bytes > 2^32
    big = torch.randn(1, side, side, 2, device="cuda", dtype=torch.float64, generator=g)
    big = big.permute(0, 3, 1, 2)  # channels-last (N, C, H, W) view: no 4 GB transpose copy
    assert big.is_contiguous(memory_format=torch.channels_last)
    corner = big[:, :, :40, :40].contiguous()
    rois = torch.tensor([[0, 20., 20, 16, 10, 0.3], [0, 18, 22, 12, 20, -2.5]], device="cuda",
                        dtype=torch.float64)
    for output_size in ((7, 7), (3, 3)):
        got = call(big, rois, output_size=output_size, scale=1.0, num_samples=2, nO=2)
        expected = call(corner, rois, output_size=output_size, scale=1.0, num_samples=2, nO=2)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("nO, fields", [(4, 5), (6, 11), (40, 1)])
def test_cuda_multilevel_matches_cpu_with_mixed_layouts(dtype, nO, fields):
    g = torch.Generator().manual_seed(28)
    sizes, scales = [(24, 20), (12, 10), (1, 1)], [1 / 4, 1 / 8, 1 / 16]
    features = [torch.randn(2, fields * nO, h, w, generator=g, dtype=torch.float64).to(dtype)
                for h, w in sizes]
    rois = random_rois(30, 2, 24, 1 / 4, g, dtype)
    levels = torch.randint(0, 3, (30,), generator=g)
    # level 0 channels-last, the others NCHW: each level is brought to the kernel's layout
    on_gpu = [channels_last(features[0].cuda())] + [f.cuda() for f in features[1:]]
    for num_samples in (2, 0):
        expected = riroi_align_rotated_multilevel(features, rois, levels, scales, (7, 7),
                                                  num_samples, nO, True)
        got = riroi_align_rotated_multilevel(on_gpu, rois.cuda(), levels.cuda(), scales, (7, 7),
                                             num_samples, nO, True)
        torch.testing.assert_close(got.cpu().double(), expected.double(), rtol=ORDER_RTOL[dtype],
                                   atol=CUDA_FORWARD_ATOL[dtype])


# ------------------ CUDA channels-last backward: chunks, levels, determinism, edges ------------------
# The backward scatter (warp per (RoI, channel chunk), lane = channel) against the CPU kernel, called
# through the raw backward ops. CUDA sums by float atomics in any order and rounds once to the
# dtype; the CPU sums in order and rounds once: float16 / bfloat16 may differ by an ulp of the sum.
BACKWARD_RTOL = {**ORDER_RTOL, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (fields, nO) as CHUNK_CASES; nO = 40 runs the older (nO > 32) kernel
BACKWARD_CHUNK_CASES = [(5, 4), (11, 6), (3, 16), (40, 1), (4, 8), (1, 40)]


def raw_backward(grad, rois, x_shape, scale=0.5, num_samples=2, nO=8, clockwise=False,
                 legacy=False):
    n, c, h, w = x_shape
    return torch.ops.redet._riroi_align_rotated_backward(grad, rois, scale, num_samples, nO,
                                                         clockwise, legacy, n, c, h, w)


def fixed_point_step(bound):
    """The resolution of the deterministic sums (csrc/common/fixed_point.h): 2^-(61 - e) with
    bound < 2^e."""
    return math.ldexp(1.0, math.frexp(bound)[1] - 61)


def assert_backward_close(got, expected, dtype):
    torch.testing.assert_close(got.cpu().double(), expected.double(), rtol=BACKWARD_RTOL[dtype],
                               atol=CUDA_BACKWARD_ATOL[dtype])


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", BACKWARD_CHUNK_CASES)
def test_cuda_backward_chunks_match_cpu(dtype, fields, nO):
    x, rois = make_case(30, dtype, nO=nO, fields=fields, h=9, w=12, k=20)
    g = torch.Generator().manual_seed(31)
    for deterministic in (False, True):
        for clockwise, legacy, num_samples, output_size in CUDA_OPTION_CASES:
            grad = torch.randn(20, fields * nO, *output_size, generator=g, dtype=torch.float64).to(dtype)
            args = (x.shape, 0.5, num_samples, nO, clockwise, legacy)
            expected = raw_backward(grad, rois, *args)
            with deterministic_mode() if deterministic else contextlib.nullcontext():
                got = raw_backward(grad.cuda(), rois.cuda(), *args)
            assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
            assert_backward_close(got, expected, dtype)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nO, fields", [(4, 5), (6, 11), (8, 4), (40, 1)])
def test_cuda_multilevel_backward_matches_cpu(dtype, nO, fields):
    """Levels of different sizes (one 1 x 1, one without RoIs) in one scratch buffer."""
    g = torch.Generator().manual_seed(32)
    heights, widths, scales = [24, 12, 6, 1], [20, 10, 5, 1], [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    rois = random_rois(40, 2, 24, 1 / 4, g, dtype)
    levels = torch.tensor([0, 1, 3] * 13 + [0])  # level 2 gets no RoI
    for num_samples, deterministic in ((2, False), (0, True), (2, True), (3, False)):
        grad = torch.randn(40, fields * nO, 7, 7, generator=g, dtype=torch.float64).to(dtype)
        args = (scales, num_samples, nO, True, False, 2, fields * nO, heights, widths)
        expected = torch.ops.redet._riroi_align_rotated_multilevel_backward(grad, rois, levels, *args)
        with deterministic_mode() if deterministic else contextlib.nullcontext():
            got = torch.ops.redet._riroi_align_rotated_multilevel_backward(
                grad.cuda(), rois.cuda(), levels.cuda(), *args)
        for level, (a, b) in enumerate(zip(got, expected)):
            assert a.shape == b.shape == (2, fields * nO, heights[level], widths[level])
            assert_backward_close(a, b, dtype)
        assert torch.equal(got[2], torch.zeros_like(got[2]))
        assert got[3].abs().sum() > 0  # the 1 x 1 level did receive gradient


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", [(11, 6), (3, 16), (40, 1), (1, 40)])
def test_cuda_deterministic_backward_chunks_are_bitwise_repeatable(dtype, fields, nO):
    x, rois = make_case(33, dtype, nO=nO, fields=fields, h=20, w=24, k=200)
    rois = rois.cuda()
    grad = torch.randn(200, fields * nO, 7, 7, device="cuda").to(dtype)
    for num_samples in (2, 0):
        with deterministic_mode():
            runs = [raw_backward(grad, rois, x.shape, num_samples=num_samples, nO=nO)
                    for _ in range(3)]
        assert all(torch.equal(runs[0], r) for r in runs[1:])
        fast = raw_backward(grad, rois, x.shape, num_samples=num_samples, nO=nO)
        if dtype == torch.float64:  # each contribution is rounded to the fixed-point step
            torch.testing.assert_close(runs[0], fast, rtol=BACKWARD_RTOL[dtype],
                                       atol=64 * fixed_point_step(grad.abs().sum().item()))
        else:
            assert_backward_close(runs[0], fast.cpu(), dtype)


@CUDA
def test_cuda_deterministic_multilevel_backward_is_bitwise_repeatable():
    g = torch.Generator().manual_seed(34)
    rois = random_rois(300, 2, 32, 1 / 4, g, torch.float32).cuda()
    levels = torch.randint(0, 3, (300,), generator=g).cuda()
    grad = torch.randn(300, 64, 7, 7, generator=g).cuda()
    args = ([1 / 4, 1 / 8, 1 / 16], 2, 8, True, False, 2, 64, [32, 16, 8], [32, 16, 8])
    with deterministic_mode():
        runs = [torch.ops.redet._riroi_align_rotated_multilevel_backward(grad, rois, levels, *args)
                for _ in range(3)]
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@CUDA
def test_cuda_backward_with_more_warps_than_the_grid():
    """K * chunks beyond the grid's warps (32 blocks of 8 warps per SM: 33792 on an H200): the
    grid-stride loop covers every (RoI, chunk)."""
    g = torch.Generator().manual_seed(35)
    rois = random_rois(6000, 2, 16, 0.5, g, torch.float32)  # 48000 (RoI, chunk) items
    grad = torch.randn(6000, 256, 2, 2, generator=g)
    expected = raw_backward(grad, rois, (2, 256, 16, 16), nO=8)
    got = raw_backward(grad.cuda(), rois.cuda(), (2, 256, 16, 16), nO=8)
    assert_backward_close(got, expected, torch.float32)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_backward_edge_cases(dtype):
    """K = 0 and off-map RoIs give zero gradients; 1 x 1 maps take every tap on their pixel."""
    grad = torch.randn(2, 20, 3, 4, dtype=torch.float64).to(dtype)
    off_map = torch.tensor([[0, 100., 100, 8, 8, 0.4], [1, -60, 3, 10, 4, -2.0]], dtype=dtype)
    on_tiny = torch.tensor([[0, 0.5, 0.5, 3, 2, 0.7], [1, 2, 1, 40, 40, 3.0]], dtype=dtype)
    for deterministic in (False, True):
        with deterministic_mode() if deterministic else contextlib.nullcontext():
            for num_samples in (2, 0):
                empty = raw_backward(grad[:0].cuda(), off_map[:0].cuda(), (2, 20, 6, 7),
                                     num_samples=num_samples, nO=4)
                assert torch.equal(empty, torch.zeros_like(empty))
                off = raw_backward(grad.cuda(), off_map.cuda(), (2, 20, 6, 7),
                                   num_samples=num_samples, nO=4)
                assert torch.equal(off, torch.zeros_like(off))
                tiny = raw_backward(grad.cuda(), on_tiny.cuda(), (2, 20, 1, 1),
                                    num_samples=num_samples, nO=4)
                expected = raw_backward(grad, on_tiny, (2, 20, 1, 1), num_samples=num_samples, nO=4)
                assert_backward_close(tiny, expected, dtype)
