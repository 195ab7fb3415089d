"""RiRoIAlignRotated on CUDA against the CPU kernel (run on the GPU machine): forward and backward
through autograd, multi-level, determinism, errors raised after the kernels ran, legacy
orientation against mmcv's kernel; the channels-last forward's chunks, layouts, bin parts and
edge cases."""
import pytest
import torch

from redet_plugin.ops import riroi_align_rotated, riroi_align_rotated_multilevel
from tests._helpers import (RIROI_CUDA_BACKWARD_ATOL, RIROI_CUDA_FORWARD_ATOL,
                            RIROI_CUDA_OPTION_CASES, RIROI_FORWARD_ATOL, RIROI_ORDER_RTOL,
                            deterministic_algorithms, riroi_call, riroi_case, riroi_levels_case,
                            riroi_rois)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nO", [8, 4, 3])
def test_cuda_matches_cpu(dtype, nO):
    x, rois = riroi_case(20, dtype, nO=nO, fields=3, h=30, w=40, k=80)
    for clockwise, legacy, num_samples in [(False, False, 2), (True, True, 0), (True, False, 1)]:
        kwargs = dict(output_size=(7, 7), nO=nO, num_samples=num_samples, clockwise=clockwise,
                      legacy=legacy)
        xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
        out_cpu, out_cuda = riroi_call(xc, rois, **kwargs), riroi_call(xg, rois.cuda(), **kwargs)
        torch.testing.assert_close(out_cuda.cpu().double(), out_cpu.double(), rtol=RIROI_ORDER_RTOL[dtype],
                                   atol=RIROI_CUDA_FORWARD_ATOL[dtype])
        grad = torch.randn(out_cpu.shape, dtype=torch.float64).to(dtype)
        out_cpu.backward(grad)
        out_cuda.backward(grad.cuda())
        torch.testing.assert_close(xg.grad.cpu().double(), xc.grad.double(), rtol=RIROI_ORDER_RTOL[dtype],
                                   atol=RIROI_CUDA_BACKWARD_ATOL[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_multilevel_equals_per_level_calls(dtype):
    features, rois, levels, scales = riroi_levels_case(21, dtype)
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
                loop = loop.index_put((index,), riroi_call(feature, rois[index], 7, scale, 2))
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


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_deterministic_backward_is_bitwise_repeatable(dtype):
    x, rois = riroi_case(22, dtype, fields=4, h=30, w=40, k=300)
    x, rois = x.cuda(), rois.cuda()
    grad = torch.randn(300, 32, 7, 7, device="cuda").to(dtype)
    results = []
    with deterministic_algorithms():
        for _ in range(3):
            xi = x.clone().requires_grad_(True)
            riroi_call(xi, rois, 7, num_samples=0).backward(grad)
            results.append(xi.grad)
    assert all(torch.equal(results[0], r) for r in results[1:])
    xi = x.clone().requires_grad_(True)
    riroi_call(xi, rois, 7, num_samples=0).backward(grad)  # fast (atomic) path agrees to rounding
    # float64: each term added in 64-bit fixed point is rounded to 2^-61 of the sum's bound (about
    # 1e-14 here); hundreds of them can differ from the float atomics by about 1e-12
    atol = 1e-11 if dtype == torch.float64 else RIROI_CUDA_BACKWARD_ATOL[dtype]
    torch.testing.assert_close(results[0].double(), xi.grad.double(), rtol=RIROI_ORDER_RTOL[dtype],
                               atol=atol)


@pytest.mark.cuda
def test_cuda_gradcheck_opcheck_and_compile():
    x, rois = riroi_case(23, fields=1, nO=4, h=6, w=7, k=4)
    x, rois = x.cuda().requires_grad_(True), rois.cuda()
    assert torch.autograd.gradcheck(lambda inp: riroi_call(inp, rois, (2, 3), nO=4), (x,))
    torch.library.opcheck(torch.ops.redet.riroi_align_rotated.default,
                          (x, rois, 0.5, 3, 2, 2, 4, True, False))
    compiled = torch.compile(lambda a: riroi_call(a, rois, 3, nO=4), fullgraph=True)
    torch.testing.assert_close(compiled(x), riroi_call(x, rois, 3, nO=4))


@pytest.mark.cuda
def test_cuda_errors_are_named():
    x = torch.randn(2, 16, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match="batch indices"):
        riroi_call(x, torch.tensor([[5.0, 4, 4, 2, 2, 0]], device="cuda"))
    with pytest.raises(RuntimeError, match="same device"):
        riroi_call(x, torch.zeros(1, 6))


@pytest.mark.cuda
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
            riroi_call(x, bad, num_samples=0)
    features, level_rois, levels, scales = riroi_levels_case(18)
    features = [f.cuda() for f in features]
    with pytest.raises(RuntimeError, match=r"levels must be in \[0, 4\); row 0 has 7"):
        riroi_align_rotated_multilevel(features, level_rois.cuda(), torch.full_like(levels, 7).cuda(),
                                       scales, 2)
    torch.cuda.synchronize()
    torch.testing.assert_close(riroi_call(x, rois).cpu(), riroi_call(x.cpu(), rois.cpu()), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("clockwise", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_legacy_orientation_equals_mmcv(clockwise, dtype):
    mmcv_ops = pytest.importorskip("mmcv.ops")
    x, rois = riroi_case(24, dtype, fields=4, h=40, w=50, k=200, scale=0.25)
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
        torch.testing.assert_close(fixed.cpu(), riroi_call(x.cpu(), rois.cpu(), output_size, 0.25,
                                                           num_samples, 8, clockwise),
                                   rtol=RIROI_ORDER_RTOL[dtype], atol=RIROI_FORWARD_ATOL[dtype])


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


def channels_last(x):
    return x.contiguous(memory_format=torch.channels_last)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", CHUNK_CASES)
def test_cuda_chunks_match_cpu_for_both_layouts(dtype, fields, nO):
    x, rois = riroi_case(25, dtype, nO=nO, fields=fields, h=9, w=12, k=20)
    xg, rois_g = x.cuda(), rois.cuda()
    for clockwise, legacy, num_samples, output_size in RIROI_CUDA_OPTION_CASES:
        kwargs = dict(output_size=output_size, nO=nO, num_samples=num_samples,
                      clockwise=clockwise, legacy=legacy)
        expected = riroi_call(x, rois, **kwargs)
        nchw = riroi_call(xg, rois_g, **kwargs)
        nhwc = riroi_call(channels_last(xg), rois_g, **kwargs)
        assert nhwc.is_contiguous() and nhwc.shape == expected.shape
        assert torch.equal(nhwc, nchw)  # one kernel, one layout after the transpose
        torch.testing.assert_close(nchw.cpu().double(), expected.double(), rtol=RIROI_ORDER_RTOL[dtype],
                                   atol=RIROI_CUDA_FORWARD_ATOL[dtype])


@pytest.mark.cuda
def test_cuda_channels_last_gradient_equals_nchw_gradient():
    x, rois = riroi_case(26, torch.float32, nO=6, fields=11, h=9, w=12, k=20)
    a = x.cuda().clone().requires_grad_(True)
    b = channels_last(x.cuda()).detach().requires_grad_(True)
    grad = torch.randn(20, 66, 3, 4, device="cuda")
    grad_a, = torch.autograd.grad(riroi_call(a, rois.cuda(), nO=6), a, grad)
    grad_b, = torch.autograd.grad(riroi_call(b, rois.cuda(), nO=6), b, grad)
    assert grad_a.is_contiguous() and grad_b.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-6, atol=1e-6)  # float atomics' order


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_edge_cases(dtype):
    """K = 0, RoIs entirely off the map (zeros), a 1 x 1 map, a RoI covering the whole map."""
    g = torch.Generator().manual_seed(27)
    x = torch.randn(2, 20, 6, 7, generator=g, dtype=torch.float64).to(dtype)
    for layout in (lambda t: t, channels_last):
        xg = layout(x.cuda())
        empty = riroi_call(xg, torch.zeros(0, 6, dtype=dtype, device="cuda"), nO=4)
        assert empty.shape == (0, 20, 3, 4) and empty.dtype == dtype
        off_map = torch.tensor([[0, 100., 100, 8, 8, 0.4], [1, -60, 3, 10, 4, -2.0]], dtype=dtype)
        out = riroi_call(xg, off_map.cuda(), nO=4)
        assert torch.equal(out, torch.zeros_like(out))
        rois = torch.tensor([[0, 0.5, 0.5, 3, 2, 0.7], [1, 2, 1, 40, 40, 3.0],
                             [1, 6, 7, 30, 20, -5.0]], dtype=dtype)
        tiny = x[:, :, :1, :1].contiguous()  # 1 x 1 maps: every tap reads the one pixel
        for features in (x, tiny):
            for num_samples in (2, 0):
                expected = riroi_call(features, rois, (3, 4), 0.5, num_samples, 4)
                got = riroi_call(layout(features.cuda()), rois.cuda(), (3, 4), 0.5, num_samples, 4)
                torch.testing.assert_close(got.cpu().double(), expected.double(),
                                           rtol=RIROI_ORDER_RTOL[dtype], atol=RIROI_CUDA_FORWARD_ATOL[dtype])


# The forward splits a RoI's bins into parts of <= 32 per warp (49 -> 25 + 24, 33 -> 17 + 16,
# 64 -> 32 + 32, 81 -> 3 x 27), and the fixed 2 x 2 grid takes a part's bins two at a time out of
# passes of 8: 1, 9, 15 and 25 bins end a pass with a single bin (its partner reads off-map taps).
FIXED_GRID_SIZES = [(1, 1), (1, 2), (3, 3), (5, 3), (4, 4), (6, 7), (7, 7), (11, 3), (8, 8), (9, 9)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fields, nO", [(4, 8), (11, 6), (5, 4), (3, 16), (40, 1)])
def test_cuda_bin_parts_and_steps_match_cpu(dtype, fields, nO):
    x, rois = riroi_case(29, dtype, nO=nO, fields=fields, h=11, w=9, k=24)
    xg, rois_g = x.cuda(), rois.cuda()
    for index, output_size in enumerate(FIXED_GRID_SIZES):
        num_samples = 2 if index % 3 else 0  # the any-grid kernel splits its bins the same way
        kwargs = dict(output_size=output_size, nO=nO, num_samples=num_samples, clockwise=True)
        expected = riroi_call(x, rois, **kwargs)
        nchw = riroi_call(xg, rois_g, **kwargs)
        assert torch.equal(riroi_call(channels_last(xg), rois_g, **kwargs), nchw)
        torch.testing.assert_close(nchw.cpu().double(), expected.double(), rtol=RIROI_ORDER_RTOL[dtype],
                                   atol=RIROI_CUDA_FORWARD_ATOL[dtype])


@pytest.mark.cuda
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
        got = riroi_call(big, rois, output_size=output_size, scale=1.0, num_samples=2, nO=2)
        expected = riroi_call(corner, rois, output_size=output_size, scale=1.0, num_samples=2, nO=2)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("nO, fields", [(4, 5), (6, 11), (40, 1)])
def test_cuda_multilevel_matches_cpu_with_mixed_layouts(dtype, nO, fields):
    g = torch.Generator().manual_seed(28)
    sizes, scales = [(24, 20), (12, 10), (1, 1)], [1 / 4, 1 / 8, 1 / 16]
    features = [torch.randn(2, fields * nO, h, w, generator=g, dtype=torch.float64).to(dtype)
                for h, w in sizes]
    rois = riroi_rois(30, 2, 24, 1 / 4, g, dtype)
    levels = torch.randint(0, 3, (30,), generator=g)
    # level 0 channels-last, the others NCHW: each level is brought to the kernel's layout
    on_gpu = [channels_last(features[0].cuda())] + [f.cuda() for f in features[1:]]
    for num_samples in (2, 0):
        expected = riroi_align_rotated_multilevel(features, rois, levels, scales, (7, 7),
                                                  num_samples, nO, True)
        got = riroi_align_rotated_multilevel(on_gpu, rois.cuda(), levels.cuda(), scales, (7, 7),
                                             num_samples, nO, True)
        torch.testing.assert_close(got.cpu().double(), expected.double(), rtol=RIROI_ORDER_RTOL[dtype],
                                   atol=RIROI_CUDA_FORWARD_ATOL[dtype])
