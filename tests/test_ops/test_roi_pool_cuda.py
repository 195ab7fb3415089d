"""RoIPool on CUDA (run on the GPU machine): bitwise equal to the CPU kernel and to torchvision's,
16-bit atomic sums within their bound, deterministic backward, errors raised after the kernel
ran, and the channels-last gather's two paths on every input layout."""
import contextlib

import pytest
import torch

from redet_plugin.ops import roi_pool
from redet_plugin.testing import channels_last_at_offset
from tests._helpers import deterministic_algorithms, roi_pool_case, roi_pool_rois, roi_pool_tolerance
from tests.test_ops._reference import roi_pool_backward_reference, roi_pool_reference

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    x, rois = roi_pool_case(10, dtype, c=16, h=30, w=40, k=50)
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
        torch.testing.assert_close(xc.grad.cpu(), x.grad, rtol=roi_pool_tolerance(dtype), atol=roi_pool_tolerance(dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_cuda_identical_to_torchvision(dtype):
    torchvision_ops = pytest.importorskip("torchvision.ops")
    x, rois = roi_pool_case(11, dtype, c=16, h=30, w=40, k=200)
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
            torch.testing.assert_close(a.grad, b.grad, rtol=roi_pool_tolerance(dtype), atol=roi_pool_tolerance(dtype))
        else:  # both add float16 gradients with 16-bit atomics, in any order
            assert_atomic_sum_close(a.grad, grad, rois, ours_arg, dtype)
            assert_atomic_sum_close(b.grad, grad, rois, theirs_arg, dtype)


@pytest.mark.cuda
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_deterministic_backward_is_bitwise_repeatable(dtype):
    x, rois = roi_pool_case(12, dtype, c=32, h=30, w=40, k=300)
    x = x.cuda()
    rois = rois.cuda()
    grad = torch.randn(300, 32, 7, 7, device="cuda").to(dtype)
    results = []
    with deterministic_algorithms():
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
        torch.testing.assert_close(results[0], xi.grad, rtol=roi_pool_tolerance(dtype), atol=roi_pool_tolerance(dtype))


@pytest.mark.cuda
def test_cuda_gradcheck_float64():
    x, rois = roi_pool_case(13, torch.float64, c=2, h=7, w=8, k=5)
    x = x.cuda().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: roi_pool(inp, rois.cuda(), (3, 2), 0.5), (x,))


@pytest.mark.cuda
def test_cuda_errors_are_named():
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="batch indices"):
        roi_pool(x, torch.tensor([[5.0, 0, 0, 1, 1]], device="cuda"), 2)
    with pytest.raises(RuntimeError, match="same device"):
        roi_pool(x, torch.zeros(1, 5), 2)


@pytest.mark.cuda
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
# RoI, bin row, group of up to 8 bins). Two paths (csrc/roi_pool/cuda/roi_pool_forward.cu): float,
# half and bfloat16 with an even C and a data pointer aligned to 2 elements take the vector path (a
# lane owns 2 adjacent channels, 64-channel chunks); double, odd C or a misaligned pointer take the
# scalar path (a lane per channel, 32-channel chunks). These cases hit both paths, partial chunks,
# several bin groups per row, every input layout, and must match the CPU kernel bit for bit.
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [1, 20, 33, 64])
def test_cuda_channels_last_gather_matches_cpu_and_reference(dtype, channels):
    x, rois = roi_pool_case(20 + channels, dtype, c=channels, h=23, w=29, k=40)
    for output_size in [(7, 7), (3, 11), (2, 17), (1, 1)]:  # 11, 17: several bin groups per row
        out, arg = assert_cuda_matches_cpu(x, rois, 0.5, output_size)
    ref, ref_arg = roi_pool_reference(x, rois, (1, 1), 0.5)
    assert torch.equal(out, ref) and torch.equal(arg, ref_arg)


@pytest.mark.cuda
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


@pytest.mark.cuda
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


@pytest.mark.cuda
def test_cuda_large_channel_count_identical_to_torchvision():
    torchvision_ops = pytest.importorskip("torchvision.ops")
    x, rois = roi_pool_case(31, c=256, h=50, w=50, k=300, scale=0.25)
    x, rois = x.cuda(), rois.cuda()
    theirs, theirs_arg = torch.ops.torchvision.roi_pool(x, rois, 0.25, 7, 7)
    for xl in (x, x.contiguous(memory_format=torch.channels_last)):
        ours, ours_arg = torch.ops.redet.roi_pool(xl, rois, 0.25, 7, 7)
        assert torch.equal(ours, theirs) and torch.equal(ours_arg, theirs_arg)
    assert torch.equal(torchvision_ops.roi_pool(x, rois, 7, 0.25), ours)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("deterministic", [True, False])
def test_cuda_channels_last_input_gets_the_nchw_gradient_in_its_layout(dtype, deterministic):
    """Ones as grad_output: every pixel's gradient is a count of bins, exact in any summation
    order, so the two layouts (and the CPU) agree bitwise."""
    x, rois = roi_pool_case(32, dtype, c=40, h=20, w=21, k=30)
    grads = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        xl = x.cuda().contiguous(memory_format=fmt).requires_grad_(True)
        with deterministic_algorithms() if deterministic else contextlib.nullcontext():
            out = roi_pool(xl, rois.cuda(), 7, 0.5)
            grads[fmt], = torch.autograd.grad(out, xl, torch.ones_like(out))
        assert grads[fmt].is_contiguous(memory_format=fmt)
    expected, = torch.autograd.grad(roi_pool(x.requires_grad_(True), rois, 7, 0.5), x,
                                    torch.ones(30, 40, 7, 7, dtype=dtype))
    assert torch.equal(grads[torch.contiguous_format].cpu(), expected)
    assert torch.equal(grads[torch.channels_last].cpu(), expected)


@pytest.mark.cuda
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


@pytest.mark.cuda
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
    rois = roi_pool_rois(30, 2, 46.0, g, dtype)
    # (bitwise equal to the CPU kernel, whose NaN rule - NaN never wins, as in torchvision - is
    # tested above; the plain reference's max() would propagate the NaNs)
    for output_size in [(7, 7), (2, 9), (1, 1)]:
        assert_cuda_matches_cpu(x, rois, 0.5, output_size)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_lane_pair_backward_matches_scalar_path(dtype):
    # The argmax of both forward paths feeds the same backward: the gradients are bitwise equal.
    x, rois = roi_pool_case(41, dtype, c=64, h=20, w=21, k=30)
    grad = torch.ones(30, 64, 7, 7, device="cuda", dtype=dtype)
    grads = []
    for xl in (x.cuda().contiguous(memory_format=torch.channels_last),
               channels_last_at_offset(x.cuda(), 1)):
        xl = xl.detach().requires_grad_(True)
        with deterministic_algorithms():
            roi_pool(xl, rois.cuda(), 7, 0.5).backward(grad)
        grads.append(xl.grad)
    assert torch.equal(grads[0], grads[1])
