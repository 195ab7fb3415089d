"""Depth-aware flow projection against the plain reference (tests/test_ops/_reference.py), with
gradients checked by gradcheck and by direct finite differences."""
import zlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

from redet_plugin.ops import DepthFlowProjection, depth_flow_projection
from tests._helpers import flow_tolerance, ours_and_reference_grads

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
OP = torch.ops.redet.depth_flow_projection.default


def make_flow(kind, batch, height, width, generator, dtype=torch.float32):
    g = generator
    if kind == "smooth":  # a low-resolution random field, upsampled
        coarse = torch.randn(batch, 2, 3, 3, generator=g) * 0.3 * max(height, width)
        flow = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear",
                                               align_corners=True)
    elif kind == "rough":
        flow = torch.randn(batch, 2, height, width, generator=g) * 3
    elif kind == "off_image":  # most pixels pushed out of the image
        flow = torch.randn(batch, 2, height, width, generator=g) + 1.5 * max(height, width)
    elif kind == "constant":
        flow = torch.ones(batch, 2, height, width) * torch.tensor([2.25, -1.5]).view(1, 2, 1, 1)
    else:
        raise ValueError(kind)
    return flow.to(dtype)


def make_case(kind="rough", batch=2, height=9, width=13, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    flow = make_flow(kind, batch, height, width, g, dtype)
    depth = (0.5 + 4 * torch.rand(batch, 1, height, width, generator=g)).to(dtype)
    return flow, depth


@pytest.mark.parametrize("kind", ["smooth", "rough", "off_image", "constant"])
@pytest.mark.parametrize("fill", [False, True])
@pytest.mark.parametrize("shape", [(2, 9, 13), (1, 16, 5), (3, 7, 7)])
def test_matches_reference(kind, fill, shape):
    flow, depth = make_case(kind, *shape, seed=zlib.crc32(repr((kind, shape)).encode()) % 1000)
    ours, ref = ours_and_reference_grads(flow, depth, 0.6, fill)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-5, atol=1e-6)  # count (holes included)
    # Rounding in the gradients' sums grows with the flow's size; where terms cancel to 0, ours and
    # the float32 reference each keep their own noise.
    atol = 2e-6 * max(1.0, flow.abs().max().item())
    for a, b in zip(ours[:1] + ours[2:], ref[:1] + ref[2:]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_accumulate_in_float32(dtype):
    flow, depth = make_case("smooth", dtype=dtype, seed=3)
    ours, ref = ours_and_reference_grads(flow, depth, 0.5, True)
    assert ours[0].dtype == dtype and ours[2].dtype == dtype and ours[3].dtype == dtype
    assert ours[1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    tol = flow_tolerance(dtype)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def test_inverse_depth_is_the_same_projection():
    flow, depth = make_case("rough", seed=4)
    out = depth_flow_projection(flow, depth, 0.3)
    out_inverse = depth_flow_projection(flow, inverse_depth=1 / depth, t=0.3)
    torch.testing.assert_close(out, out_inverse, rtol=1e-5, atol=1e-6)
    ours, ref = ours_and_reference_grads(flow, 1 / depth, 0.3, True, inverse=True)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 6), (2, 5, 1), (1, 2, 2)])
@pytest.mark.parametrize("fill", [False, True])
def test_tiny_images(shape, fill):
    flow, depth = make_case("rough", *shape, seed=6)
    flow = flow * 0.4
    ours, ref = ours_and_reference_grads(flow, depth, 1.0, fill)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_hand_computed_example():
    # 1x3 image, t = 1. Pixel 0 moves by +0.5 to x = 0.5: it reaches pixels 0 and 1 with -0.5.
    # Pixel 1 moves by +1 to x = 2 (right border: R = L = 2, the contribution counts twice).
    # Pixel 2 moves off the image. Pixel 1 hears only pixel 0, pixel 2 only pixel 1.
    flow = torch.tensor([[0.5, 1.0, 5.0], [0.0, 0.0, 0.0]]).view(1, 2, 1, 3)
    depth = torch.tensor([1.0, 4.0, 1.0]).view(1, 1, 1, 3)
    out, count = OP(flow, depth, 1.0, False, False, True)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([-0.5, -0.5, -1.0]))
    torch.testing.assert_close(count[0, 0, 0], torch.tensor([2.0, 2.0, 1.0]))  # T = B: doubled
    # 1x5 image, t = 1: pixel 1 lands on x = 0 (reaches 0 and 1 with +1), pixel 3 on x = 3.5
    # (reaches 3 and 4 with -0.5), the others leave the image. Pixel 2 is a hole: the mean of its
    # nearest non-holes to the left (1) and right (-0.5); top and bottom have none.
    flow = torch.tensor([[9.0, -1.0, 9.0, 0.5, 9.0], [0.0] * 5]).view(1, 2, 1, 5)
    out, count = OP(flow, torch.ones(1, 1, 1, 5), 1.0, False, True, True)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([1.0, 1.0, 0.25, -0.5, -0.5]))
    torch.testing.assert_close(count[0, 0, 0], torch.tensor([2.0, 2.0, -2.0, 2.0, 2.0]))


def test_t_zero_gives_zeros_without_holes():
    flow, depth = make_case("rough", seed=7)
    flow.requires_grad_(True)
    depth.requires_grad_(True)
    out, count = OP(flow, depth, 0.0, False, True, True)
    assert torch.equal(out, torch.zeros_like(out)) and bool((count > 0).all())
    out.backward(torch.randn_like(out))
    assert torch.equal(flow.grad, torch.zeros_like(flow)) and torch.equal(depth.grad, torch.zeros_like(depth))


def test_nan_flow_pixels_are_dropped():
    flow, depth = make_case("rough", seed=8)
    flow[0, 0, 3, 4] = float("nan")
    ours, ref = ours_and_reference_grads(flow, depth, 0.5, True)
    assert torch.isfinite(ours[0]).all() and torch.isfinite(ours[2]).all()
    assert ours[2][0, :, 3, 4].abs().sum() == 0  # a dropped pixel gets no gradient
    ref[2][0, :, 3, 4] = 0  # (the reference's autograd gives NaN there)
    assert ours[3][0, 0, 3, 4] == 0
    ref[3][0, 0, 3, 4] = 0
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fill", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_gradcheck_float64(fill, inverse):
    flow, depth = make_case("rough", 2, 5, 6, torch.float64, seed=9)
    depth = 1 / depth if inverse else depth
    flow.requires_grad_(True)
    depth.requires_grad_(True)
    fn = lambda f, d: OP(f, d, 0.7, inverse, fill, True)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (flow, depth), eps=1e-6, atol=1e-6)


def test_depth_gradient_by_finite_differences():
    """dL/dD for L = <grad, out>, one pixel at a time (DAIN's kernel, with (G - out) where
    -(G + out) belongs, is off by 12-40 % in such a check: ANCHORS.md)."""
    flow, depth = make_case("smooth", 1, 6, 7, torch.float64, seed=10)
    grad = torch.randn(flow.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    d = depth.clone().requires_grad_(True)
    (depth_flow_projection(flow, d, 0.8, False) * grad).sum().backward()
    eps = 1e-6
    numeric = torch.zeros_like(depth)
    for i in range(depth.numel()):
        plus, minus = depth.clone(), depth.clone()
        plus.view(-1)[i] += eps
        minus.view(-1)[i] -= eps
        numeric.view(-1)[i] = ((depth_flow_projection(flow, plus, 0.8, False) * grad).sum()
                               - (depth_flow_projection(flow, minus, 0.8, False) * grad).sum()) / (2 * eps)
    assert numeric.abs().max() > 1e-3  # the check has something to check
    torch.testing.assert_close(d.grad, numeric, rtol=1e-6, atol=1e-7)


def test_non_contiguous_inputs_and_grad_output():
    flow, depth = make_case("rough", 2, 8, 10, seed=11)
    flow_nc = flow.transpose(2, 3).contiguous().transpose(2, 3)
    depth_nc = torch.stack([depth, depth], dim=-1)[..., 0]  # stride 2
    assert not flow_nc.is_contiguous() and not depth_nc.is_contiguous()
    f, d = flow_nc.clone().requires_grad_(), depth_nc.detach().clone().requires_grad_()
    out = depth_flow_projection(f, d, 0.5)
    grad = torch.randn(2, 2, 1, 10).expand(2, 2, 8, 10)  # stride 0: the peer reads it wrongly
    out.backward(grad)
    ours, ref = ours_and_reference_grads(flow, depth, 0.5, True)
    torch.testing.assert_close(out, ref[0])
    f2, d2 = flow.clone().requires_grad_(), depth.clone().requires_grad_()
    depth_flow_projection(f2, d2, 0.5).backward(grad.contiguous())
    torch.testing.assert_close(f.grad, f2.grad)
    torch.testing.assert_close(d.grad, d2.grad)


def run_twice(device, deterministic):
    flow, depth = make_case("smooth", 2, 40, 50, seed=12)
    results = []
    torch.use_deterministic_algorithms(deterministic)
    try:
        for _ in range(2):
            f = flow.to(device).requires_grad_(True)
            d = depth.to(device).requires_grad_(True)
            out = depth_flow_projection(f, d, 0.5)
            out.backward(torch.ones_like(out))
            results.append((out, f.grad, d.grad))
    finally:
        torch.use_deterministic_algorithms(False)
    return results


def test_deterministic_cpu():
    first, second = run_twice("cpu", True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.cuda
def test_deterministic_cuda():
    first, second = run_twice("cuda", True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_matches_cpu(dtype, deterministic):
    for kind in ["smooth", "rough", "off_image", "constant"]:
        flow, depth = make_case(kind, 2, 33, 47, dtype, seed=13)
        cpu = ours_and_reference_grads(flow, depth, 0.5, True)[0]
        torch.use_deterministic_algorithms(deterministic)
        try:
            cuda = ours_and_reference_grads(flow.cuda(), depth.cuda(), 0.5, True)[0]
        finally:
            torch.use_deterministic_algorithms(False)
        tol = max(2 * flow_tolerance(dtype), 1e-4)  # float atomics sum in another order
        for a, b in zip(cuda, cpu):
            torch.testing.assert_close(a.cpu().double(), b.double(), rtol=tol, atol=tol)


def pan_case():
    """A pan: whole columns and rows stay empty, which the fill skips walking through."""
    flow = torch.zeros(2, 2, 40, 64)
    flow[:, 0], flow[:, 1] = 30.0, -12.0
    flow = flow + 0.3 * torch.randn(flow.shape, generator=torch.Generator().manual_seed(3))
    depth = 1 + torch.rand(2, 1, 40, 64, generator=torch.Generator().manual_seed(4))
    return flow, depth


def test_pan_with_empty_rows_and_columns():
    flow, depth = pan_case()
    ours, ref = ours_and_reference_grads(flow, depth, 0.7, True)
    assert (ours[1] <= 0).float().mean() > 0.3  # a wide band of holes
    for a, b in zip(ours, ref):  # (hole gradients gather long runs: float32 summation order)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_pan_matches_cpu():
    flow, depth = pan_case()
    cpu = ours_and_reference_grads(flow, depth, 0.7, True)[0]
    cuda = ours_and_reference_grads(flow.cuda(), depth.cuda(), 0.7, True)[0]
    for a, b in zip(cuda, cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fill", [False, True])
def test_opcheck(fill):
    flow, depth = make_case("rough", 2, 5, 6, seed=14)
    flow.requires_grad_(True)
    depth.requires_grad_(True)
    torch.library.opcheck(OP, (flow, depth, 0.5, False, fill, True))
    out, count = OP(flow, depth, 0.5, False, fill, True)
    grad = torch.randn_like(out)
    torch.library.opcheck(torch.ops.redet._depth_flow_projection_backward.default,
                          (grad, flow.detach(), depth.detach(), out.detach(), count, 0.5, False, fill))


def test_compile_fullgraph():
    module = DepthFlowProjection(t=0.4)
    compiled = torch.compile(lambda f, d: module(f, d) * 2, fullgraph=True, backend="aot_eager")
    flow, depth = make_case("smooth", seed=15)
    f = flow.clone().requires_grad_(True)
    out = compiled(f, depth)
    out.sum().backward()
    torch.testing.assert_close(out, module(flow, depth) * 2)
    f2 = flow.clone().requires_grad_(True)
    (module(f2, depth) * 2).sum().backward()
    torch.testing.assert_close(f.grad, f2.grad)


def test_double_backward_raises():
    flow, depth = make_case("rough", seed=16)
    flow.requires_grad_(True)
    out = depth_flow_projection(flow, depth)
    (grad,) = torch.autograd.grad(out.sum(), flow, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad.sum().backward()


def test_bad_inputs_name_the_argument():
    flow, depth = make_case("rough")
    with pytest.raises(RuntimeError, match=r"flow must have shape \(B, 2, H, W\)"):
        depth_flow_projection(flow[:, :1], depth)
    with pytest.raises(RuntimeError, match=r"depth must have shape \(B, 1, H, W\)"):
        depth_flow_projection(flow, depth[:, :, :-1])
    with pytest.raises(RuntimeError, match="depth must have the same dtype as flow"):
        depth_flow_projection(flow, depth.double())
    with pytest.raises(RuntimeError, match=r"t must be in \[0, 1\], got 1.5"):
        depth_flow_projection(flow, depth, t=1.5)
    with pytest.raises(RuntimeError, match=r"t must be in \[0, 1\], got -0.1"):
        OP(flow, depth, -0.1, False, True, True)
    with pytest.raises(TypeError, match="t must be a number"):
        depth_flow_projection(flow, depth, t="half")
    bad = depth.clone()
    bad[1, 0, 2, 3] = 0.0
    with pytest.raises(RuntimeError, match=r"depth must be > 0 \(and not NaN\), got 0"):
        depth_flow_projection(flow, bad)
    bad[1, 0, 2, 3] = float("nan")
    with pytest.raises(RuntimeError, match="depth must be > 0.*got nan"):
        depth_flow_projection(flow, bad)
    with pytest.raises(RuntimeError, match="inverse_depth must be finite and >= 0, got -2.29"):
        depth_flow_projection(flow, inverse_depth=-depth)
    with pytest.raises(ValueError, match="exactly one of depth and inverse_depth"):
        depth_flow_projection(flow, depth, inverse_depth=depth)
    with pytest.raises(TypeError, match="flow must be a tensor, got ndarray"):
        depth_flow_projection(flow.numpy(), depth)
    with pytest.raises(RuntimeError, match="flow must be float16"):
        depth_flow_projection(flow.long(), depth.long())
    # check_depth=False skips the value check (documented): no error, weights as given.
    depth_flow_projection(flow, bad, check_depth=False)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("inverse, value", [(False, 0.0), (False, -1.0), (False, float("nan")),
                                            (True, -1.0), (True, float("inf")),
                                            (True, float("nan"))])
def test_unchecked_bad_depth_pixels_contribute_nothing(device, inverse, value):
    """With check_depth=False (and in a CUDA graph, where nothing is checked) a pixel with an
    invalid depth is dropped, like a pixel whose flow is NaN, and gets no gradient."""
    flow, depth = (x.to(device) for x in make_case("rough", seed=20))
    depth = 1.0 / depth if inverse else depth
    bad_depth, nan_flow = depth.clone(), flow.clone()
    bad_depth[1, 0, 2, 3] = value
    nan_flow[1, :, 2, 3] = float("nan")
    for fill in (False, True):
        got, expected = (ours_and_reference_grads(f, d, 0.5, fill, inverse, check=False)[0]
                         for f, d in ((flow, bad_depth), (nan_flow, depth)))
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, equal_nan=True)
        assert got[2][1, :, 2, 3].eq(0).all() and got[3][1, 0, 2, 3] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
def test_cuda_bad_depth_values_raise(fill):
    """On CUDA the scatter flags bad values in pinned memory, read after one event wait: the same
    errors as on the CPU, and the next good call is not affected by the last bad one."""
    flow, depth = (x.cuda() for x in make_case("rough"))
    expected = depth_flow_projection(flow, depth, fill_holes=fill)
    bad = depth.clone()
    bad[1, 0, 2, 3] = 0.0
    with pytest.raises(RuntimeError, match=r"depth must be > 0 \(and not NaN\), got 0"):
        depth_flow_projection(flow, bad, fill_holes=fill)
    # (float atomics: equal up to the summation order)
    torch.testing.assert_close(depth_flow_projection(flow, depth, fill_holes=fill), expected)
    bad[1, 0, 2, 3] = float("nan")
    with pytest.raises(RuntimeError, match="depth must be > 0.*got nan"):
        depth_flow_projection(flow, bad, fill_holes=fill)
    with pytest.raises(RuntimeError, match="inverse_depth must be finite and >= 0, got -"):
        depth_flow_projection(flow, inverse_depth=-depth, fill_holes=fill)
    depth_flow_projection(flow, bad, fill_holes=fill, check_depth=False)  # unchecked: no error
    torch.cuda.synchronize()


@pytest.mark.cuda
def test_cuda_depth_checks_from_several_threads():
    """Each thread has its own flags: concurrent good and bad calls each get their own answer."""
    from concurrent.futures import ThreadPoolExecutor
    flow, depth = (x.cuda() for x in make_case("rough", batch=2, height=64, width=96))
    bad = depth.clone()
    bad[0, 0, 10, 20] = -1.0

    def run(i):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            try:
                depth_flow_projection(flow, bad if i % 2 else depth)
                return "ok"
            except RuntimeError as error:
                return "error" if "depth must be > 0" in str(error) else str(error)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(40)))
    assert results == ["error" if i % 2 else "ok" for i in range(40)]


@pytest.mark.cuda
def test_device_mismatch():
    flow, depth = make_case("rough")
    with pytest.raises(RuntimeError, match="depth must be on the same device as flow"):
        depth_flow_projection(flow.cuda(), depth)


def test_module_and_registry():
    from mmdet.registry import MODELS
    import redet_plugin.mm  # noqa: F401  (registers the mm layer)
    module = MODELS.build(dict(type="RedetDepthFlowProjection", t=0.25, fill_holes=False))
    assert isinstance(module, DepthFlowProjection) and "t=0.25" in repr(module)
    flow, depth = make_case("smooth", seed=17)
    torch.testing.assert_close(module(flow, depth), depth_flow_projection(flow, depth, 0.25, False))


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 2), height=st.integers(1, 12), width=st.integers(1, 12),
       scale=st.floats(0.0, 8.0), t=st.floats(0.0, 1.0), fill=st.booleans(),
       seed=st.integers(0, 2**16))
def test_hypothesis_against_reference(batch, height, width, scale, t, fill, seed):
    g = torch.Generator().manual_seed(seed)
    flow = torch.randn(batch, 2, height, width, generator=g) * scale
    depth = 0.2 + 5 * torch.rand(batch, 1, height, width, generator=g)
    ours, ref = ours_and_reference_grads(flow, depth, t, fill)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
