"""Small depth-aware flow projection runs for compute-sanitizer (memcheck, racecheck): every CUDA
kernel (float/double atomics and fixed-point scatter; normalisation; the hole filling's tiled
mark and fill kernels; the backward's terms, tiled hole-run summaries and terms, and gather,
with contiguous, expanded and transposed grad_output) on edge cases: 1x1, single row/column,
everything pushed off the image (all holes), border landings, B > 1, and the large-hole cases of
the tests on a wide image (many row words), a tall one and a very tall narrow one (searches over
many column words), and exact cases on the fill kernels' boundaries (see
tests/test_ops/test_depth_flow_projection_fill_exact.py); with and without the depth check (its
flag), one image large enough for the marking's one-warp-per-tile path, and invalid depths:
checked (raised after the kernels), unchecked, and in replays of a captured CUDA graph (nothing
checks: such pixels contribute nothing).
Usage (repo root):
    compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_depth_flow_projection
"""

import torch

import redet_plugin.ops  # noqa: F401
from redet_plugin.testing import HOLE_KINDS, capture, exact_hole_case, hole_case


def cases():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(1, 2, 1, 1, generator=g), torch.rand(1, 1, 1, 1, generator=g) + 0.5
    yield torch.randn(2, 2, 1, 7, generator=g) * 3, torch.rand(2, 1, 1, 7, generator=g) + 0.5
    yield torch.randn(1, 2, 6, 1, generator=g) * 3, torch.rand(1, 1, 6, 1, generator=g) + 0.5
    yield torch.full((2, 2, 5, 6), 100.0), torch.ones(2, 1, 5, 6)          # all off the image
    flow = torch.zeros(1, 2, 4, 5)
    flow[:, 0], flow[:, 1] = 4 - torch.arange(5.0), 3 - torch.arange(4.0)[:, None]  # onto the corner
    yield flow, torch.ones(1, 1, 4, 5)
    yield torch.randn(3, 2, 17, 23, generator=g) * 4, torch.rand(3, 1, 17, 23, generator=g) + 0.1
    for kind in HOLE_KINDS:
        yield hole_case(kind, 2, 3, 300)   # wide: 10 row words, partial tiles
        yield hole_case(kind, 1, 70, 35)   # tall: 3 x 2 tiles, partial both ways
        yield hole_case(kind, 2, 4200, 2)  # very tall: searches over many column words
    # the fill kernels' boundaries (hole_fill_kernels.cuh): partial tiles, one row, one column,
    # long searches along rows and along columns
    for shape in [(2, 1, 33), (1, 33, 1), (2, 40, 1025), (1, 2, 33000), (1, 1100, 3)]:
        yield exact_hole_case(*shape, seed=sum(shape))
    # the backward's tiles: runs of holes over many tiles of a row (walks of more than one batch
    # of summaries), partial tiles both ways
    yield hole_case("half", 1, 3, 9000)
    yield hole_case("bands", 2, 65, 97)


def grad_output(out, *choice):
    """A contiguous, an expanded (stride 0, as from .sum()) or a transposed grad_output: the
    backward reads it through its strides."""
    kind = sum(choice) % 3
    if kind == 0:
        return torch.randn_like(out)
    if kind == 1:
        return torch.ones(1, 1, 1, 1, device=out.device, dtype=out.dtype).expand_as(out)
    return torch.randn_like(out.transpose(2, 3)).transpose(2, 3)


def run():
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for flow, depth in cases():
            for deterministic in (False, True):
                for fill in (False, True):
                    torch.use_deterministic_algorithms(deterministic)
                    f = flow.to("cuda", dtype).requires_grad_(True)
                    d = depth.to("cuda", dtype).requires_grad_(True)
                    out = redet_plugin.ops.depth_flow_projection(f, d, 0.5, fill, check_depth=fill)
                    out.backward(grad_output(out, deterministic, fill))
    torch.use_deterministic_algorithms(False)
    # enough tiles for one warp per tile in the marking (the cases above have few: four per
    # tile), and for the backward's tiles to fill every block, several passes of its grid-stride
    # loops
    flow, depth = exact_hole_case(1, 1100, 1100, seed=0)
    for fill in (False, True):
        f, d = flow.cuda().requires_grad_(True), depth.cuda().requires_grad_(True)
        redet_plugin.ops.depth_flow_projection(f, d, 0.5, fill).sum().backward()
    bad = torch.ones(1, 1, 4, 40, device="cuda")
    bad[0, 0, 2, 3] = 0
    try:
        redet_plugin.ops.depth_flow_projection(torch.zeros(1, 2, 4, 40, device="cuda"), bad)
        raise AssertionError("invalid depth not reported")
    except RuntimeError as error:
        assert "depth must be > 0" in str(error)
    run_invalid_depth_unchecked_and_captured()
    torch.cuda.synchronize()


def run_invalid_depth_unchecked_and_captured():
    flow = (torch.randn(2, 2, 9, 40, device="cuda") * 3).requires_grad_(True)
    depth = (torch.rand(2, 1, 9, 40, device="cuda") + 0.5).requires_grad_(True)
    grad = torch.ones(2, 2, 9, 40, device="cuda")
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        for fill in (False, True):
            def step(flow, depth, grad):
                out = redet_plugin.ops.depth_flow_projection(flow, depth, 0.5, fill)
                return (out, *torch.autograd.grad(out, (flow, depth), grad))

            graph, _ = capture(step, flow, depth, grad)
            for value in (0.0, -1.0, float("nan")):
                with torch.no_grad():
                    depth[1, 0, 4, 17] = value
                graph.replay()
                out = redet_plugin.ops.depth_flow_projection(flow, depth, 0.5, fill,
                                                             check_depth=False)
                torch.autograd.grad(out, (flow, depth), grad)
                with torch.no_grad():
                    depth[1, 0, 4, 17] = 1.0
    torch.use_deterministic_algorithms(False)


if __name__ == "__main__":
    run()
    print("sanitize_depth_flow_projection: done")
