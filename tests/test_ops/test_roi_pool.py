"""RoIPool against the plain reference (tests/test_ops/_reference.py), torchvision's semantics."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from redet_plugin.ops import RoIPool, roi_pool
from tests._helpers import deterministic_mode
from tests.test_ops._reference import roi_pool_backward_reference, roi_pool_reference

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def random_rois(num_rois, num_images, size, generator=None, dtype=torch.float32):
    """Float boxes (batch, x1, y1, x2, y2) in image coordinates: some off the map, some malformed
    (x2 < x1), some tiny."""
    g = generator
    batch = torch.randint(0, num_images, (num_rois, 1), generator=g).float()
    xy1 = torch.rand(num_rois, 2, generator=g) * size * 1.2 - size * 0.1
    wh = torch.rand(num_rois, 2, generator=g) * size * 0.8 - size * 0.1  # some negative
    return torch.cat([batch, xy1, xy1 + wh], dim=1).to(dtype)


def make_case(seed, dtype=torch.float32, n=2, c=3, h=13, w=17, k=9, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(dtype)
    rois = random_rois(k, n, max(h, w) / scale, g, dtype)
    return x, rois


def tolerance(dtype):
    return {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}.get(dtype, 1e-10)


def assert_atomic_sum_close(grad_input, grad, rois, argmax, dtype):
    """The CUDA backward adds float16/bfloat16 gradients with 16-bit atomics, in any order (as
    torchvision does): each pixel's sum of n terms is within n * eps * sum|terms| of the exact sum
    (the bound of recursive summation, every partial sum rounded once)."""
    grad, rois, argmax = grad.cpu(), rois.cpu(), argmax.cpu()
    shape = grad_input.shape
    exact = roi_pool_backward_reference(grad, rois, argmax, shape)
    terms = roi_pool_backward_reference(torch.ones_like(grad), rois, argmax, shape)
    magnitude = roi_pool_backward_reference(grad.abs(), rois, argmax, shape)
    bound = terms * torch.finfo(dtype).eps * magnitude
    error = (grad_input.cpu().double() - exact).abs()
    assert (error <= bound).all(), f"max error {error.max():.3g}, worst excess {(error - bound).max():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("output_size", [(2, 2), (3, 5), (7, 7)])
def test_forward_and_backward_match_reference(dtype, output_size):
    x, rois = make_case(1, dtype)
    x.requires_grad_(True)
    out = roi_pool(x, rois, output_size, spatial_scale=0.5)
    ref, ref_arg = roi_pool_reference(x, rois, output_size, 0.5)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # max pooling copies values exactly
    _, arg = torch.ops.redet.roi_pool(x, rois, 0.5, *output_size)
    assert torch.equal(arg, ref_arg)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_grad = roi_pool_backward_reference(grad, rois, ref_arg, x.shape)
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=tolerance(dtype), atol=tolerance(dtype))


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
    x, rois = make_case(2)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    ordered = torch.cat([rois[rois[:, 0] == i] for i in range(2)])
    module = RoIPool((3, 3), 0.5)
    assert module.output_size == (3, 3) and "output_size=(3, 3)" in repr(module)
    torch.testing.assert_close(module(x, boxes), roi_pool(x, ordered, 3, 0.5))


def test_non_contiguous_inputs():
    x, rois = make_case(3, c=4)
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
    x, rois = make_case(4, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: roi_pool(inp, rois, (3, 2), 0.5), (x,))


def test_double_backward_gradgradcheck():
    x, rois = make_case(5, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda inp: roi_pool(inp, rois, (3, 2), 0.5), (x,))


def test_autograd_runs_in_cpp():
    """Autograd of the op and of its backward op (double backward) is registered in C++
    (csrc/roi_pool/roi_pool_autograd.cpp): no Python runs per call."""
    x, rois = make_case(5, torch.float64, c=2, h=7, w=8, k=5)
    x.requires_grad_(True)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 3, 2)
    assert out.grad_fn.name() == "torch::autograd::CppNode<redet::(anonymous namespace)::RoIPool>"
    grad = torch.randn_like(out).requires_grad_(True)
    grad_input = torch.ops.redet._roi_pool_backward(grad, rois, arg, *x.shape)
    assert grad_input.grad_fn.name().endswith("::RoIPoolBackward>")


def test_rois_requiring_grad_only_does_not_crash():
    x, rois = make_case(6)
    rois.requires_grad_(True)
    out = roi_pool(x, rois, 2, 0.5)
    assert out.requires_grad is False or out.grad_fn is not None


def test_opcheck():
    x, rois = make_case(7, c=2)
    x.requires_grad_(True)
    torch.library.opcheck(torch.ops.redet.roi_pool.default, (x, rois, 0.5, 3, 3))
    grad = torch.randn(rois.shape[0], 2, 3, 3)
    _, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 3, 3)
    torch.library.opcheck(torch.ops.redet._roi_pool_backward.default, (grad, rois, arg, *x.shape))


@pytest.mark.parametrize("sizes, message", [
    ((1, 2, 0, 6), r"at least 1 x 1 .* got height 0 and width 6"),
    ((1, 2, 6, -1), r"at least 1 x 1 .* got height 6 and width -1"),
    ((-1, 2, 6, 6), r"batch_size and channels must be >= 0, got -1"),
])
def test_raw_backward_checks_the_sizes_it_allocates(sizes, message):
    x, rois = make_case(9, c=2, h=6, w=6)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 2, 2)
    with pytest.raises(RuntimeError, match=message):  # height 0 once crashed the CPU kernel
        torch.ops.redet._roi_pool_backward(torch.ones_like(out), rois, arg, *sizes)


def test_raw_backward_skips_argmax_and_batch_indices_outside_the_gradient():
    """Only the raw op can receive these (the forward never makes them): nothing is written outside
    the gradient, and the valid entries still land."""
    x, rois = make_case(10, c=2, h=6, w=6)
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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("column, value", [(0, 7.0), (0, -1.0), (0, 0.5), (0, float("nan")),
                                           (2, float("nan")), (4, float("inf"))])
def test_raw_backward_gives_bad_rows_no_gradient(device, column, value):
    """Rows that break the RoI rules (csrc/common/roi_rows.h) pass no gradient, on both devices."""
    x, rois = make_case(11, c=2, h=6, w=6)
    x, rois = x.to(device), rois.to(device)
    out, arg = torch.ops.redet.roi_pool(x, rois, 0.5, 2, 2)
    grad = torch.ones_like(out)
    without_row = grad.clone()
    without_row[1] = 0
    bad = rois.clone()
    bad[1, column] = value
    torch.testing.assert_close(torch.ops.redet._roi_pool_backward(grad, bad, arg, *x.shape),
                               torch.ops.redet._roi_pool_backward(without_row, rois, arg, *x.shape))


def test_torch_compile_fullgraph():
    x, rois = make_case(8)
    compiled = torch.compile(lambda a, b: roi_pool(a, b, 3, 0.5) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, rois), roi_pool(x, rois, 3, 0.5) * 2)


def test_backward_is_deterministic():
    x, rois = make_case(9, k=64, c=8)
    grads = []
    with deterministic_mode():
        for _ in range(3):
            xi = x.clone().requires_grad_(True)
            roi_pool(xi, rois, 7, 0.5).backward(torch.ones(64, 8, 7, 7))
            grads.append(xi.grad)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


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


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(1, 12), w=st.integers(1, 12),
       k=st.integers(0, 6), ph=st.integers(1, 5), pw=st.integers(1, 5),
       scale=st.sampled_from([0.25, 0.5, 1.0, 1.7]), seed=st.integers(0, 2**31 - 1))
def test_fuzz_against_reference(n, c, h, w, k, ph, pw, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g)
    rois = random_rois(k, n, max(h, w) / scale, g)
    out = roi_pool(x, rois, (ph, pw), scale)
    ref, _ = roi_pool_reference(x, rois, (ph, pw), scale)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_ties_and_nan_follow_torchvision_rule():
    g = torch.Generator().manual_seed(40)
    x = torch.randint(-2, 3, (2, 3, 12, 13), generator=g).float()  # many ties: the first max wins
    rois = random_rois(20, 2, 13, g)
    out, arg = torch.ops.redet.roi_pool(x, rois, 1.0, 3, 4)
    ref, ref_arg = roi_pool_reference(x, rois, (3, 4), 1.0)
    assert torch.equal(out, ref) and torch.equal(arg, ref_arg)
    nan = float("nan")
    x = torch.tensor([[[[nan, 1.0, nan], [2.0, nan, 2.0]], [[nan] * 3, [nan] * 3]]])  # (1, 2, 2, 3)
    out, arg = torch.ops.redet.roi_pool(x, torch.tensor([[0, 0., 0, 2, 1]]), 1.0, 1, 1)
    assert out[0, 0].item() == 2.0 and arg[0, 0].item() == 3  # NaN never wins; first of the 2.0s
    assert out[0, 1].item() == torch.finfo(torch.float32).min and arg[0, 1].item() == -1  # all NaN


# ---------------------------------- CUDA (run on the GPU machine) ----------------------------------
@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    x, rois = make_case(10, dtype, c=16, h=30, w=40, k=50)
    xc = x.cuda().requires_grad_(True)
    x.requires_grad_(True)
    out_cpu, out_cuda = roi_pool(x, rois, 7, 0.5), roi_pool(xc, rois.cuda(), 7, 0.5)
    assert torch.equal(out_cuda.cpu(), out_cpu)
    grad = torch.randn_like(out_cpu)
    out_cpu.backward(grad)
    out_cuda.backward(grad.cuda())
    if dtype in (torch.float16, torch.bfloat16):  # summed in 16 bits (the CPU sums in float32)
        _, argmax = torch.ops.redet.roi_pool(x.detach(), rois, 0.5, 7, 7)
        assert_atomic_sum_close(xc.grad, grad, rois, argmax, dtype)
    else:
        torch.testing.assert_close(xc.grad.cpu(), x.grad, rtol=tolerance(dtype), atol=tolerance(dtype))


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_cuda_identical_to_torchvision(dtype):
    torchvision_ops = pytest.importorskip("torchvision.ops")
    x, rois = make_case(11, dtype, c=16, h=30, w=40, k=200)
    x = x.cuda()
    rois = rois.cuda()
    for output_size in [(7, 7), (3, 5)]:
        a = x.clone().requires_grad_(True)
        b = x.clone().requires_grad_(True)
        ours = roi_pool(a, rois, output_size, 0.5)
        theirs = torchvision_ops.roi_pool(b, rois, output_size, 0.5)
        assert torch.equal(ours, theirs)
        _, ours_arg = torch.ops.redet.roi_pool(x, rois, 0.5, *output_size)
        _, theirs_arg = torch.ops.torchvision.roi_pool(x, rois, 0.5, *output_size)
        assert torch.equal(ours_arg, theirs_arg)
        grad = torch.randn_like(ours)
        ours.backward(grad)
        theirs.backward(grad)
        if dtype != torch.float16:
            torch.testing.assert_close(a.grad, b.grad, rtol=tolerance(dtype), atol=tolerance(dtype))
        else:  # both add float16 gradients with 16-bit atomics, in any order
            assert_atomic_sum_close(a.grad, grad, rois, ours_arg, dtype)
            assert_atomic_sum_close(b.grad, grad, rois, theirs_arg, dtype)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (1, 3, 1, 3), (2, 1, 1, 1), (1, 1, 1, 1)])
def test_cuda_16bit_backward_reaches_every_element(dtype, shape):
    """A 16-bit gradient is added as one lane of a 32-bit paired atomic: both lanes of every pair,
    and an odd-sized map's last element (its partner would lie outside the tensor), get exact sums
    (two terms per pixel, multiples of 1/4: exact in 16 bits)."""
    n, c, h, w = shape
    x = torch.randn(shape).to(dtype).cuda()
    rois = torch.tensor([[i, 0., 0, w - 1, h - 1] for i in range(n)] * 2).to(dtype).cuda()
    xi = x.clone().requires_grad_(True)
    out = roi_pool(xi, rois, (h, w), 1.0)  # one pixel per bin: every pixel is an argmax
    grad = (torch.randint(1, 8, out.shape) / 4).to(dtype).cuda()
    out.backward(grad)
    _, argmax = torch.ops.redet.roi_pool(x, rois, 1.0, h, w)
    assert (argmax >= 0).all()
    exact = roi_pool_backward_reference(grad.cpu(), rois.cpu(), argmax.cpu(), shape)
    assert (exact > 0).all() and torch.equal(xi.grad.cpu().double(), exact)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_deterministic_backward_is_bitwise_repeatable(dtype):
    x, rois = make_case(12, dtype, c=32, h=30, w=40, k=300)
    x = x.cuda()
    rois = rois.cuda()
    grad = torch.randn(300, 32, 7, 7, device="cuda").to(dtype)
    results = []
    with deterministic_mode():
        for _ in range(3):
            xi = x.clone().requires_grad_(True)
            roi_pool(xi, rois, 7, 0.5).backward(grad)
            results.append(xi.grad)
    assert all(torch.equal(results[0], r) for r in results[1:])
    xi = x.clone().requires_grad_(True)
    roi_pool(xi, rois, 7, 0.5).backward(grad)  # fast (atomic) path agrees to rounding
    if dtype in (torch.float16, torch.bfloat16):  # (the deterministic path sums exactly)
        _, argmax = torch.ops.redet.roi_pool(x, rois, 0.5, 7, 7)
        assert_atomic_sum_close(results[0], grad, rois, argmax, dtype)
        assert_atomic_sum_close(xi.grad, grad, rois, argmax, dtype)
    else:
        torch.testing.assert_close(results[0], xi.grad, rtol=tolerance(dtype), atol=tolerance(dtype))


@CUDA
def test_cuda_gradcheck_float64():
    x, rois = make_case(13, torch.float64, c=2, h=7, w=8, k=5)
    x = x.cuda().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: roi_pool(inp, rois.cuda(), (3, 2), 0.5), (x,))


@CUDA
def test_cuda_errors_are_named():
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="batch indices"):
        roi_pool(x, torch.tensor([[5.0, 0, 0, 1, 1]], device="cuda"), 2)
    with pytest.raises(RuntimeError, match="same device"):
        roi_pool(x, torch.zeros(1, 5), 2)


@CUDA
@pytest.mark.parametrize("column, value, message", [
    (0, 2.0, r"batch indices in \[0, 2\).*row 2 has 2"),
    (0, 0.5, r"integer batch indices in \[0, 2\).*row 2 has 0.5"),
    (0, float("nan"), r"NaN or infinite values \(row 2\)"),
    (3, float("inf"), r"NaN or infinite values \(row 2\)"),
])
def test_cuda_bad_rois_raise_after_the_kernel_ran(column, value, message):
    """The CUDA check is read back after the kernel is enqueued (the GPU never waits for the host):
    the kernel must skip the bad row safely, the error must name it, and the device stays usable."""
    x = torch.randn(2, 3, 8, 8, device="cuda")
    rois = torch.tensor([[0.0, 1, 1, 6, 5], [1, 0, 2, 3, 7]] * 2, device="cuda")
    bad = rois.clone()
    bad[2, column] = value
    with pytest.raises(RuntimeError, match=message):
        roi_pool(x, bad, 2)
    torch.cuda.synchronize()
    torch.testing.assert_close(roi_pool(x, rois, 2).cpu(), roi_pool(x.cpu(), rois.cpu(), 2))


# The CUDA forward gathers from a channels-last copy of the input, one warp per (chunk of channels,
# RoI, bin row, group of up to 8 bins). Two paths (csrc/roi_pool/cuda/roi_pool_cuda.cu): float, half
# and bfloat16 with an even C and a data pointer aligned to 2 elements take the vector path (a lane
# owns 2 adjacent channels, 64-channel chunks); double, odd C or a misaligned pointer take the
# scalar path (a lane per channel, 32-channel chunks). These cases hit both paths, partial chunks,
# several bin groups per row, every input layout, and must match the CPU kernel bit for bit.
def channels_last_at_offset(x, offset):
    """x's values in channels-last memory that starts `offset` elements into its storage: an odd
    offset misaligns the element pairs, so the forward must take its scalar path."""
    n, c, h, w = x.shape
    storage = torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)
    view = storage[offset:].view(n, h, w, c).permute(0, 3, 1, 2)
    view.copy_(x)
    assert view.is_contiguous(memory_format=torch.channels_last) and view.storage_offset() == offset
    return view


def cuda_layouts(x):
    """The same values on the GPU as NCHW, channels-last (also at an odd and an even storage
    offset), and (N, C, W, H) memory (neither)."""
    xc = x.cuda()
    return {"nchw": xc, "channels_last": xc.contiguous(memory_format=torch.channels_last),
            "channels_last_misaligned": channels_last_at_offset(xc, 1),
            "channels_last_offset_2": channels_last_at_offset(xc, 2),
            "transposed": xc.transpose(2, 3).contiguous().transpose(2, 3)}


def assert_cuda_matches_cpu(x, rois, scale, output_size):
    cpu_out, cpu_arg = torch.ops.redet.roi_pool(x, rois, scale, *output_size)
    for layout, xc in cuda_layouts(x).items():
        out, arg = torch.ops.redet.roi_pool(xc, rois.cuda(), scale, *output_size)
        assert out.is_contiguous() and arg.is_contiguous(), layout
        assert torch.equal(out.cpu(), cpu_out), (layout, output_size)
        assert torch.equal(arg.cpu(), cpu_arg), (layout, output_size)
    return cpu_out, cpu_arg


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [1, 20, 33, 64])
def test_cuda_channels_last_gather_matches_cpu_and_reference(dtype, channels):
    x, rois = make_case(20 + channels, dtype, c=channels, h=23, w=29, k=40)
    for output_size in [(7, 7), (3, 11), (2, 17), (1, 1)]:  # 11, 17: several bin groups per row
        out, arg = assert_cuda_matches_cpu(x, rois, 0.5, output_size)
    ref, ref_arg = roi_pool_reference(x, rois, (1, 1), 0.5)
    assert torch.equal(out, ref) and torch.equal(arg, ref_arg)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_edge_cases_match_cpu(dtype):
    cases = [  # (input, rois, spatial_scale)
        (torch.randn(2, 5, 1, 1), torch.tensor([[0, 0., 0, 0, 0], [1, -3, -3, 5, 5]]), 1.0),  # 1x1 maps
        (torch.randn(1, 40, 6, 7), torch.tensor([[0, 50., 50, 60, 60],  # off the map: empty bins
                                                 [0, -30, -30, -20, -20],
                                                 [0, 2, 2, 100, 3],      # partly off the map
                                                 [0, 5, 4, 1, 1]]), 1.0),  # malformed -> 1x1
        (torch.randn(1, 33, 5, 5), torch.zeros(0, 5), 1.0),  # no RoIs
        (torch.randn(3, 3, 9, 4), torch.tensor([[2, 0., 0, 30, 30], [0, 1, 1, 2, 2]]), 0.25),
    ]
    for x, rois, scale in cases:
        x, rois = x.to(dtype), rois.to(dtype)
        for output_size in [(2, 3), (7, 7), (4, 9)]:
            out, arg = assert_cuda_matches_cpu(x, rois, scale, output_size)
            ref, ref_arg = roi_pool_reference(x, rois, output_size, scale)
            assert torch.equal(out, ref) and torch.equal(arg, ref_arg)
    _, arg = torch.ops.redet.roi_pool(cases[1][0].cuda(), cases[1][1].cuda(), 1.0, 7, 7)
    assert (arg[:2] == -1).all()  # the fully-off-map RoIs: every bin empty


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_ties_nan_and_inf_follow_the_cpu_rule(dtype):
    g = torch.Generator().manual_seed(30)
    x = torch.randint(-2, 3, (2, 40, 12, 13), generator=g).to(dtype)  # many ties: first max wins
    x[0, 3, 2:6, 2:6] = float("nan")       # NaN never wins
    x[0, 5] = float("nan")                 # all-NaN plane: -FLT_MAX (-inf in float16) and -1
    x[1, 7] = float("-inf")                # all -inf: the same
    x[1, 8, 4, 4] = float("inf")
    rois = torch.tensor([[0, 0., 0, 12, 11], [1, 2, 1, 9, 10], [0, 3, 3, 6, 6]]).to(dtype)
    out, arg = assert_cuda_matches_cpu(x, rois, 1.0, (3, 3))
    assert (arg[0, 5] == -1).all() and (arg[1, 7] == -1).all() and not out.isnan().any()


@CUDA
def test_cuda_large_channel_count_identical_to_torchvision():
    torchvision_ops = pytest.importorskip("torchvision.ops")
    x, rois = make_case(31, c=256, h=50, w=50, k=300, scale=0.25)
    x, rois = x.cuda(), rois.cuda()
    theirs, theirs_arg = torch.ops.torchvision.roi_pool(x, rois, 0.25, 7, 7)
    for xl in (x, x.contiguous(memory_format=torch.channels_last)):
        ours, ours_arg = torch.ops.redet.roi_pool(xl, rois, 0.25, 7, 7)
        assert torch.equal(ours, theirs) and torch.equal(ours_arg, theirs_arg)
    assert torch.equal(torchvision_ops.roi_pool(x, rois, 7, 0.25), ours)


@CUDA
def test_cuda_channels_last_input_backward_matches_nchw():
    x, rois = make_case(32, c=40, h=20, w=21, k=30)
    grads = []
    for xl in (x.cuda(), x.cuda().contiguous(memory_format=torch.channels_last)):
        xl = xl.detach().requires_grad_(True)
        with deterministic_mode():
            roi_pool(xl, rois.cuda(), 7, 0.5).backward(torch.ones(30, 40, 7, 7, device="cuda"))
        grads.append(xl.grad)
    assert torch.equal(grads[0], grads[1])


@CUDA
@pytest.mark.parametrize("channels", [33, 34])  # the scalar and the vector path
def test_cuda_huge_map_uses_64_bit_offsets(channels):
    # More than 2**31 elements: the kernel's int64 offset variant. Checked against the same RoIs on
    # a small crop of the bottom-right corner, where offsets pass 2**31.
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs a GPU with 24 GB")
    height = width = 8100
    x = torch.empty(1, channels, height, width, device="cuda",
                    memory_format=torch.channels_last).normal_()
    assert x.numel() > 2**31
    corner = 7900
    rois = torch.tensor([[0, 8000., 8010, 8090, 8099], [0, 8050, 8050, 8099, 8070], [0, 8200, 0, 8300, 5]],
                        device="cuda")
    out, arg = torch.ops.redet.roi_pool(x, rois, 1.0, 7, 7)
    crop_rois = rois - torch.tensor([0., corner, corner, corner, corner], device="cuda")
    crop_out, crop_arg = torch.ops.redet.roi_pool(x[..., corner:, corner:], crop_rois, 1.0, 7, 7)
    crop_size = width - corner
    moved = (crop_arg // crop_size + corner) * width + crop_arg % crop_size + corner
    assert torch.equal(out, crop_out) and torch.equal(arg, torch.where(crop_arg >= 0, moved, crop_arg))
    assert (arg[2] == -1).all() and (arg[:2] >= 0).all()
    del x


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [2, 34, 66, 130, 35])
def test_cuda_lane_pair_path_matches_cpu(dtype, channels):
    # Even C: the vector path (2 channels a lane) on aligned layouts, 66 and 130 end in a chunk of
    # 2 channels (one active lane); odd C (35) and the misaligned layout: the scalar path.
    # Values from a small set: many ties (the first max must win in each channel of a pair).
    g = torch.Generator().manual_seed(40 + channels)
    x = (torch.randint(-4, 5, (2, channels, 19, 23), generator=g) * 0.25).to(dtype)
    x[0, 1, 3:9, 4:12] = float("nan")  # the odd channel of the first pair only
    x[1, 0, :, :5] = float("-inf")      # the even one only
    rois = random_rois(30, 2, 46.0, g, dtype)
    # (bitwise equal to the CPU kernel, whose NaN rule - NaN never wins, as in torchvision - is
    # tested above; the plain reference's max() would propagate the NaNs)
    for output_size in [(7, 7), (2, 9), (1, 1)]:
        assert_cuda_matches_cpu(x, rois, 0.5, output_size)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_lane_pair_backward_matches_scalar_path(dtype):
    # The argmax of both forward paths feeds the same backward: the gradients are bitwise equal.
    x, rois = make_case(41, dtype, c=64, h=20, w=21, k=30)
    grad = torch.ones(30, 64, 7, 7, device="cuda", dtype=dtype)
    grads = []
    for xl in (x.cuda().contiguous(memory_format=torch.channels_last),
               channels_last_at_offset(x.cuda(), 1)):
        xl = xl.detach().requires_grad_(True)
        with deterministic_mode():
            roi_pool(xl, rois.cuda(), 7, 0.5).backward(grad)
        grads.append(xl.grad)
    assert torch.equal(grads[0], grads[1])
