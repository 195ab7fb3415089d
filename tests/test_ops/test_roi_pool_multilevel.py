"""roi_pool_multilevel: every RoI pooled from its own feature level in one launch, equal to
roi_pool per level (and to the float64 reference), its argmax indexing the levels' maps laid end
to end, its gradients those of the per-level calls, on the CPU and on CUDA."""
import pytest
import torch

from redet_plugin.ops import roi_pool, roi_pool_multilevel
from redet_plugin.testing import capture, channels_last_at_offset
from tests._helpers import roi_pool_rois, roi_pool_tolerance
from tests.test_ops._reference import roi_pool_reference

SIZES = [(24, 28), (12, 14), (6, 7), (3, 4)]
SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def levels_case(seed, dtype=torch.float64, n=2, c=3, k=40, sizes=SIZES, scales=SCALES):
    """(features, rois, levels): random maps of an FPN's sizes, RoIs over the image (some off it,
    some malformed), each given a random level, every level used."""
    g = torch.Generator().manual_seed(seed)
    features = [torch.randn(n, c, h, w, generator=g).to(dtype) for h, w in sizes]
    image_size = sizes[0][1] / scales[0]
    rois = roi_pool_rois(k, n, image_size, g, dtype)
    levels = torch.randint(0, len(sizes), (k,), generator=g)
    levels[:len(sizes)] = torch.arange(len(sizes))
    return features, rois, levels


def per_level(features, rois, levels, scales, output_size):
    """(output, argmax) of roi_pool called level by level, the argmax moved to the pixels of every
    level and image laid end to end (level-major, then image-major)."""
    output = argmax = None
    start = 0
    images = rois[:, 0].long()[:, None, None, None]
    for level, (feature, scale) in enumerate(zip(features, scales)):
        out, arg = torch.ops.redet.roi_pool(feature, rois, scale, *output_size)
        plane = feature.shape[2] * feature.shape[3]
        arg = torch.where(arg >= 0, arg + start + images * plane, arg)
        member = (levels == level)[:, None, None, None]
        output = out if output is None else torch.where(member, out, output)
        argmax = arg if argmax is None else torch.where(member, arg, argmax)
        start += feature.shape[0] * plane
    return output, argmax


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("output_size", [(7, 7), (3, 5)])
def test_equals_roi_pool_per_level(dtype, output_size):
    features, rois, levels = levels_case(1, dtype)
    out, arg = torch.ops.redet.roi_pool_multilevel(features, rois, levels, SCALES, *output_size)
    want, want_arg = per_level(features, rois, levels, SCALES, output_size)
    assert torch.equal(out, want) and torch.equal(arg, want_arg)


def test_equals_the_float64_reference_level_by_level():
    features, rois, levels = levels_case(2)
    out = roi_pool_multilevel(features, rois, levels, SCALES, 7)
    for level, (feature, scale) in enumerate(zip(features, SCALES)):
        member = levels == level
        ref, _ = roi_pool_reference(feature, rois[member], (7, 7), scale)
        assert torch.equal(out[member], ref)


def test_gradients_are_the_per_level_calls():
    """Every level gets a gradient (zeros where it has no RoI), equal to the per-level calls'."""
    features, rois, levels = levels_case(3)
    levels[levels == 2] = 1  # level 2 has no RoI
    fused_inputs = [f.clone().requires_grad_(True) for f in features]
    loop_inputs = [f.clone().requires_grad_(True) for f in features]
    fused = roi_pool_multilevel(fused_inputs, rois, levels, SCALES, (3, 4))
    loop = torch.zeros_like(fused)
    for level, (feature, scale) in enumerate(zip(loop_inputs, SCALES)):
        member = levels == level
        loop = loop.index_put((member.nonzero().flatten(),),
                              roi_pool(feature, rois[member], (3, 4), scale))
    grad = torch.randn_like(fused)
    fused.backward(grad)
    loop.backward(grad)
    for a, b in zip(fused_inputs, loop_inputs):
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(fused_inputs[2].grad, torch.zeros_like(features[2]))


def test_gradcheck_gradgradcheck_opcheck_and_compile():
    features, rois, levels = levels_case(4, c=2, k=8, sizes=[(6, 5), (3, 3), (2, 2)],
                                         scales=SCALES[:3])
    features = [f.requires_grad_(True) for f in features]
    fn = lambda *fs: roi_pool_multilevel(list(fs), rois, levels, SCALES[:3], 2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(features))
    assert torch.autograd.gradgradcheck(fn, tuple(features))
    torch.library.opcheck(torch.ops.redet.roi_pool_multilevel.default,
                          (features, rois, levels, SCALES[:3], 2, 2))
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    compiled(*features).sum().backward()


def test_channels_last_features_get_channels_last_gradients():
    """Levels all channels-last: channels-last gradients; mixed layouts: NCHW ones; the values are
    the same either way."""
    features, rois, levels = levels_case(5, c=4)
    grad = torch.randn(rois.shape[0], 4, 7, 7, dtype=torch.float64)
    expected = None
    for formats in ([torch.contiguous_format] * 4, [torch.channels_last] * 4,
                    [torch.channels_last, torch.contiguous_format] * 2):
        xs = [f.contiguous(memory_format=fmt).requires_grad_(True)
              for f, fmt in zip(features, formats)]
        got = torch.autograd.grad(roi_pool_multilevel(xs, rois, levels, SCALES, 7), xs, grad)
        wanted = formats[0] if len(set(formats)) == 1 else torch.contiguous_format
        assert all(t.is_contiguous(memory_format=wanted) for t in got)
        expected = expected or got
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_fake_kernel_gives_the_shapes():
    features, rois, levels = levels_case(6, c=5)
    meta = [f.to("meta") for f in features]
    out, arg = torch.ops.redet.roi_pool_multilevel(meta, rois.to("meta"), levels.to("meta"),
                                                   SCALES, 3, 2)
    assert out.shape == (rois.shape[0], 5, 3, 2) and arg.dtype == torch.int32


@pytest.mark.parametrize("change, error, message", [
    (lambda a: a.update(features=a["features"][0]), TypeError, "features must be a list"),
    (lambda a: a.update(spatial_scales=0.25), TypeError, "spatial_scales must be a list"),
    (lambda a: a.update(spatial_scales=SCALES[:3]), RuntimeError, "one scale per feature level"),
    (lambda a: a.update(levels=a["levels"].int()), RuntimeError, "levels must be int64"),
    (lambda a: a.update(levels=a["levels"][:3]), RuntimeError, r"levels must have shape \(K,\)"),
    (lambda a: a["levels"].__setitem__(5, 4), RuntimeError, "level"),
    (lambda a: a.update(rois=a["rois"][:, :4]), RuntimeError, r"rois must have shape \(K, 5\)"),
    (lambda a: a.update(features=[a["features"][0], a["features"][1][:, :2]]), RuntimeError,
     r"features\[1\] must have the batch size and channels"),
])
def test_bad_input_is_named(change, error, message):
    features, rois, levels = levels_case(7)
    arguments = dict(features=features, rois=rois, levels=levels, spatial_scales=SCALES)
    change(arguments)
    with pytest.raises(error, match=message):
        roi_pool_multilevel(output_size=7, **arguments)


# ----------------------------------------------- CUDA ---------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [1, 33, 64])  # the scalar path, partial chunks, the pair path
def test_cuda_matches_cpu_in_every_layout(dtype, channels):
    features, rois, levels = levels_case(8, dtype, c=channels)
    cpu_out, cpu_arg = torch.ops.redet.roi_pool_multilevel(features, rois, levels, SCALES, 7, 7)
    layouts = {"nchw": lambda x: x, "channels_last": lambda x: x.contiguous(
        memory_format=torch.channels_last), "misaligned": lambda x: channels_last_at_offset(x, 1)}
    for name, layout in layouts.items():
        xs = [layout(f.cuda()) for f in features]
        out, arg = torch.ops.redet.roi_pool_multilevel(xs, rois.cuda(), levels.cuda(), SCALES, 7, 7)
        assert torch.equal(out.cpu(), cpu_out) and torch.equal(arg.cpu(), cpu_arg), name


@pytest.mark.cuda
def test_cuda_gradients_match_cpu():
    features, rois, levels = levels_case(9, torch.float64, c=8)
    grad = torch.randn(rois.shape[0], 8, 7, 7, dtype=torch.float64)
    cpu = [f.clone().requires_grad_(True) for f in features]
    gpu = [f.cuda().requires_grad_(True) for f in features]
    roi_pool_multilevel(cpu, rois, levels, SCALES, 7).backward(grad)
    roi_pool_multilevel(gpu, rois.cuda(), levels.cuda(), SCALES, 7).backward(grad.cuda())
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=0, atol=1e-12)


@pytest.mark.cuda
def test_cuda_bad_level_raises_after_the_kernel_ran():
    features, rois, levels = levels_case(10, torch.float32)
    bad = levels.clone()
    bad[3] = len(SIZES)
    xs, cuda_rois = [f.cuda() for f in features], rois.cuda()
    with pytest.raises(RuntimeError, match="level"):
        roi_pool_multilevel(xs, cuda_rois, bad.cuda(), SCALES, 7)
    torch.cuda.synchronize()
    torch.testing.assert_close(roi_pool_multilevel(xs, cuda_rois, levels.cuda(), SCALES, 7).cpu(),
                               roi_pool_multilevel(features, rois, levels, SCALES, 7))


@pytest.mark.cuda
def test_cuda_graph_replay_follows_new_features():
    features, rois, levels = levels_case(11, torch.float32, c=8)
    xs = [f.cuda().requires_grad_(True) for f in features]
    cuda_rois, cuda_levels = rois.cuda(), levels.cuda()
    grad = torch.randn(rois.shape[0], 8, 7, 7, device="cuda")

    def step():
        out = roi_pool_multilevel(xs, cuda_rois, cuda_levels, SCALES, 7)
        return (out, *torch.autograd.grad(out, xs, grad))

    graph, outputs = capture(step)
    with torch.no_grad():
        for x in xs:
            x.copy_(torch.randn_like(x))
    graph.replay()
    expected = step()
    assert torch.equal(outputs[0], expected[0])
    tol = roi_pool_tolerance(torch.float32)  # the gradients are atomic sums, added in any order
    for got, want in zip(outputs[1:], expected[1:]):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.cuda
def test_cuda_bad_level_in_a_graph_pools_zeros_and_passes_no_gradient():
    """A replay checks nothing: the kernels' guards skip the row."""
    features, rois, levels = levels_case(12, torch.float64, c=4, k=6)
    xs = [f.cuda().requires_grad_(True) for f in features]
    cuda_rois, cuda_levels = rois.cuda(), levels.cuda()
    grad = torch.randn(6, 4, 7, 7, dtype=torch.float64, device="cuda")

    def step(levels, grad):
        out = roi_pool_multilevel(xs, cuda_rois, levels, SCALES, 7)
        return (out, *torch.autograd.grad(out, xs, grad))

    graph, outputs = capture(step, cuda_levels, grad)
    cuda_levels[1] = len(SIZES)
    graph.replay()
    without_row = grad.clone()
    without_row[1] = 0
    expected = step(levels.cuda(), without_row)
    assert outputs[0][1].eq(0).all()
    torch.testing.assert_close(outputs[0][[0, 2, 3, 4, 5]], expected[0][[0, 2, 3, 4, 5]])
    for got, want in zip(outputs[1:], expected[1:]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
