"""The flow projection's backward across the 32 x 32 tiles of the hole filling's backward
(csrc/depth_flow_projection/depth_flow_projection_backward_math.h): runs of holes crossing tile boundaries in
both directions, over many tiles, partial tiles, single rows and columns, landings on the last
row and column (counted twice); grad_output with any strides; float64 gradcheck; CUDA against
the CPU, which makes the same calls in the same order."""
import pytest
import torch

import redet_plugin.ops  # noqa: F401  (loads the op)
from redet_plugin.testing import HOLE_KINDS, exact_hole_case, hole_case
from tests._helpers import assert_close_to_scale, ours_and_reference_grads

OP = torch.ops.redet.depth_flow_projection.default

# (batch, height, width): partial tiles both ways, several tiles per row and per column, one row,
# one column, tiles of exactly 32
SHAPES = [(2, 70, 100), (1, 33, 200), (1, 1, 150), (2, 150, 1), (1, 140, 40), (1, 64, 64)]


def fractional(flow, seed):
    """Moves every landing off the integer grid, so that finite differences see no floor jump."""
    g = torch.Generator().manual_seed(seed)
    return flow + 0.1 + 0.8 * torch.rand(flow.shape, generator=g, dtype=flow.dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fill", [False, True])
def test_exact_cases_match_reference(shape, fill):
    """Runs of holes of every length across tile boundaries, landings on the border (integer
    shifts that stay inside: the last column and row are reached twice), float64."""
    flow, depth = exact_hole_case(*shape, seed=sum(shape), dtype=torch.float64)
    ours, ref = ours_and_reference_grads(flow, depth, 1.0, fill)
    assert bool((ours[1] <= 0).any()) and bool((ours[1] > 0).any())  # holes and non-holes
    assert_close_to_scale(ours, ref, 1e-10)


@pytest.mark.parametrize("shape", [(2, 75, 130), (1, 200, 300)])  # (runs over up to 10 tiles)
@pytest.mark.parametrize("kind", HOLE_KINDS)
def test_large_holes_across_tiles_match_reference(kind, shape):
    flow, depth = hole_case(kind, *shape, seed=len(kind), dtype=torch.float64)
    ours, ref = ours_and_reference_grads(flow, depth, 1.0, True)
    assert_close_to_scale(ours, ref, 1e-10)


@pytest.mark.parametrize("fill", [False, True])
def test_strided_grad_output_gives_the_same_gradients(fill):
    flow, depth = exact_hole_case(2, 40, 70, seed=3)
    flow = fractional(flow, 4)
    g = torch.Generator().manual_seed(5)
    grads = {
        "expanded": torch.randn(2, 2, 1, 70, generator=g).expand(2, 2, 40, 70),  # stride 0
        "transposed": torch.randn(2, 2, 70, 40, generator=g).transpose(2, 3),
        "sliced": torch.randn(2, 4, 40, 71, generator=g)[:, ::2, :, 1:],
        "channels_last": torch.randn(2, 2, 40, 70, generator=g).contiguous(
            memory_format=torch.channels_last),
    }
    for name, grad in grads.items():
        results = []
        for gr in (grad, grad.contiguous()):
            f, d = flow.clone().requires_grad_(), depth.clone().requires_grad_()
            out, _ = OP(f, d, 0.8, False, fill, True)
            out.backward(gr)
            results.append((f.grad, d.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("fill", [False, True])
def test_gradcheck_float64_across_tile_boundaries(fill):
    """34 x 35: one full and one partial tile each way; runs of holes cross both boundaries."""
    flow, depth = exact_hole_case(1, 34, 35, seed=7, dtype=torch.float64)
    flow = fractional(flow, 8).requires_grad_(True)
    depth = depth.requires_grad_(True)
    assert bool((OP(flow, depth, 0.9, False, False, True)[1] <= 0).float().mean() > 0.1)
    fn = lambda f, d: OP(f, d, 0.9, False, fill, True)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (flow, depth), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("fill", [False, True])
def test_gradcheck_float64_many_tiles_fast_mode(fill):
    flow, depth = hole_case("bands", 2, 80, 110, seed=9, dtype=torch.float64)
    flow = flow.requires_grad_(True)
    depth = depth.requires_grad_(True)
    fn = lambda f, d: OP(f, d, 1.0, False, fill, True)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (flow, depth), eps=1e-6, atol=1e-6, fast_mode=True)


# ---- CUDA ------------------------------------------------------------------------------------
# Shapes for the CUDA kernels' boundaries
# (csrc/depth_flow_projection/cuda/depth_flow_projection_backward.cu): partial tiles, many tiles per
# row (walks over more than four summaries), many per column, a row narrower than a warp's 128-pixel
# span of the terms kernel and one wider, one row, one column, an odd number of rows for the
# gather's 2-row strips.
CUDA_SHAPES = [(2, 70, 100), (1, 1, 300), (1, 300, 1), (3, 33, 129), (1, 9, 2049), (2, 1100, 3),
               (1, 31, 33), (1, 2, 33000)]


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
@pytest.mark.parametrize("kind", ["exact", "bands", "half", "borders"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_backward_matches_cpu(kind, dtype, fill):
    if dtype == torch.float32 and kind in ("half", "borders"):
        pytest.skip("float32 forwards (atomics in any order) differ at ~1e-7 of flows of "
                    "thousands of pixels, and the depth gradient cancels them: the float64 runs "
                    "check these")
    # exact: the forwards agree bit for bit, the backwards add in the same order (FMAs aside)
    tol = 1e-9 if dtype == torch.float64 else 1e-5 if kind == "exact" else 2e-3
    for shape in CUDA_SHAPES:
        if kind == "exact":
            flow, depth = exact_hole_case(*shape, seed=sum(shape), dtype=dtype)
        else:
            flow, depth = hole_case(kind, *shape, seed=len(kind), dtype=dtype)
        cpu = ours_and_reference_grads(flow, depth, 1.0, fill)[0]
        cuda = ours_and_reference_grads(flow.cuda(), depth.cuda(), 1.0, fill)[0]
        assert_close_to_scale(cuda, cpu, tol)


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
def test_cuda_strided_grad_output(fill):
    flow, depth = exact_hole_case(2, 40, 70, seed=3)
    flow, depth = fractional(flow, 4).cuda(), depth.cuda()
    grad = torch.randn(2, 2, 1, 70, device="cuda").expand(2, 2, 40, 70)
    # one forward (its float atomics may add in any order), several backwards of it
    f, d = flow.clone().requires_grad_(), depth.clone().requires_grad_()
    out, _ = OP(f, d, 0.8, False, fill, True)
    results = [torch.autograd.grad(out, (f, d), gr, retain_graph=True)
               for gr in (grad, grad.transpose(2, 3).contiguous().transpose(2, 3),
                          grad.contiguous())]
    for other in results[:2]:
        for a, b in zip(other, results[2]):
            assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
def test_cuda_backward_is_bitwise_repeatable(fill):
    flow, depth = hole_case("borders", 2, 300, 500, seed=2)
    flow, depth = flow.cuda(), depth.cuda()
    grad = torch.randn_like(flow)
    # the backward has no atomics: the same forward's backward is bitwise the same every time
    # (the forward's float atomics may add in any order, so it runs once)
    f, d = flow.clone().requires_grad_(), depth.clone().requires_grad_()
    out, _ = OP(f, d, 0.7, False, fill, True)
    results = [torch.autograd.grad(out, (f, d), grad, retain_graph=True) for _ in range(2)]
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_backward_op_names_a_bad_grad_output():
    flow, depth = exact_hole_case(1, 5, 6, seed=1)
    out, count = OP(flow, depth, 0.5, False, True, True)
    backward = torch.ops.redet._depth_flow_projection_backward
    with pytest.raises(RuntimeError, match="grad_output and output must have the dtype of flow"):
        backward(out.double(), flow, depth, out, count, 0.5, False, True)
    with pytest.raises(RuntimeError, match="grad_output and output must have the shape"):
        backward(out[:, :, 1:], flow, depth, out, count, 0.5, False, True)


@pytest.mark.cuda
@pytest.mark.parametrize("fill", [False, True])
def test_cuda_sources_adding_no_weight_reach_holes(fill):
    """Sources of inverse depth 0 land but add nothing to the count: where nothing else lands they
    reach holes, and their inverse-depth gradient, -(G·S + S_w), must see zero terms there. An
    earlier backward of the same size leaves other terms in the workspace the allocator hands out
    again: a kernel that skipped the holes' terms would read those."""
    height, width = 40, 70
    g = torch.Generator().manual_seed(5)
    flow = fractional(torch.zeros(1, 2, height, width, dtype=torch.float64), 6)
    inverse = 0.5 + torch.rand(1, 1, height, width, generator=g, dtype=torch.float64)
    right = torch.arange(width) >= width // 2
    flow_far = flow.clone()
    flow_far[:, 0, :, ~right] = -1000.0  # the left half leaves the image
    inverse_far = inverse.clone()
    inverse_far[..., right] = 0.0  # the right half stays, with weight 0: every pixel a hole
    grad = torch.randn(1, 2, height, width, generator=g, dtype=torch.float64)

    def grads(flow, inverse, device):
        f = flow.to(device).requires_grad_()
        w = inverse.to(device).requires_grad_()
        out, _ = OP(f, w, 1.0, True, fill, True)
        return torch.autograd.grad(out, (f, w), grad.to(device))

    grads(flow, inverse, "cuda")  # terms everywhere, left in the freed workspace
    cuda = grads(flow_far, inverse_far, "cuda")
    cpu = grads(flow_far, inverse_far, "cpu")
    assert not bool(cpu[1].any())  # nothing projected: no gradient
    assert_close_to_scale(cuda, cpu, 1e-12)
