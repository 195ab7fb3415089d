"""Small RiRoIAlignRotated runs for compute-sanitizer (memcheck, racecheck): every CUDA kernel on
edge cases. Forward: the channels-last kernel (fixed 2 x 2 grid and any grid; NCHW and
channels-last input; chunks that fill a warp, leave lanes idle, or end part-way; the fixed grid's
bin parts per warp and passes of 8 bins that end with one bin) and the NCHW
kernel of nO > 32; fast and deterministic backward: the channels-last scatter (both grids, grad
tiles of 32 bins with a partial last tile, idle lanes) with its channels-last -> NCHW conversion
(NCHW input) or its flat conversion (channels-last input), and the one-thread-per-input scatter of
nO > 32; multi-level with mixed layouts. Bad RoI rows (NaN/inf, bad
batch index or level) reach the kernels in eager calls (the check raises after them) and in replays
of captured CUDA graphs (nothing checks: the kernels write zeros / skip the row).
Usage (repo root):
    compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_riroi_align_rotated
    compute-sanitizer --tool racecheck python -m benchmarks.sanitize.sanitize_riroi_align_rotated"""
import math

import torch

import redet_plugin.ops  # noqa: F401
from redet_plugin.ops import riroi_align_rotated, riroi_align_rotated_multilevel
from redet_plugin.testing import capture

# (batch, height, width, rois): off-map, 1 x 1 map, no RoIs, a RoI covering the whole map
SPATIAL_CASES = [
    (2, 9, 11, [[0, 4., 4, 6, 3, 0.3], [1, -5, -5, 30, 30, -2.0], [0, 8, 6, 2, 2, math.pi / 4]]),
    (1, 1, 1, [[0, 0., 0, 1, 1, 1.0], [0, 1, 0, 5, 3, -0.5]]),
    (1, 5, 5, []),
    (1, 5, 5, [[0, 50., 50, 6, 6, 0.5]]),
    (1, 5, 5, [[0, 2., 2, 40, 40, -7.0]]),
]
# (nO, fields): C = 16 (full chunks of 32 lanes hold 4 groups; one chunk, 16 lanes idle),
# C = 20 with nO = 4, nO = 6 (30-lane chunks 30 + 30 + 6), nO = 16, nO = 1, nO = 40 (NCHW kernel)
ORIENTATION_CASES = [(8, 2), (4, 5), (6, 11), (16, 3), (1, 40), (40, 1)]


def run_single(dtype, batch, height, width, rois, nO, fields, num_samples, layout, deterministic):
    x = torch.randn(batch, fields * nO, height, width, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=layout).requires_grad_(True)
    boxes = torch.tensor(rois, device="cuda", dtype=dtype).reshape(-1, 6)
    torch.use_deterministic_algorithms(deterministic)
    try:
        out = riroi_align_rotated(x, boxes, (2, 3), 0.5, num_samples, nO, True)
        out.backward(torch.ones_like(out))
    finally:
        torch.use_deterministic_algorithms(False)


# (num_samples, output size) pairs: both kernel grids; 49 and 35 bins load grad_output in a full
# and a partial tile of 32 bins (17 bins: passes of 8 bins that end with one bin).
BACKWARD_GRIDS = [((2, (7, 7)), (0, (5, 7))), ((2, (5, 7)), (1, (7, 7)))]


def run_backward(dtype, batch, height, width, rois, nO, fields, grids, deterministic):
    """The raw backward op for each (num_samples, output size)."""
    boxes = torch.tensor(rois, device="cuda", dtype=dtype).reshape(-1, 6)
    channels = fields * nO
    torch.use_deterministic_algorithms(deterministic)
    try:
        for num_samples, output_size in grids:
            grad = torch.randn(boxes.shape[0], channels, *output_size, device="cuda", dtype=dtype)
            torch.ops.redet._riroi_align_rotated_backward(
                grad, boxes, 0.5, num_samples, nO, True, False, batch, channels, height, width)
    finally:
        torch.use_deterministic_algorithms(False)


# The forward gives each warp a part of <= 32 of a RoI's bins (49 -> 25 + 24, 64 -> 32 + 32,
# 81 -> 3 x 27); the fixed 2 x 2 grid takes a part's bins two at a time out of passes of 8 bins:
# parts that end a pass with one bin (1, 9, 25, 27) read the off-map taps written past it.
FIXED_GRID_SIZES = [(1, 1), (3, 3), (7, 7), (8, 8), (9, 9)]


def run_bin_parts_forward(dtype):
    """Forward with num_samples = 2 (the fixed-grid kernel; and 81 bins on any grid): bin parts,
    passes ending with one bin, lanes past the chunk's channels (C = 20 with nO = 4, C = 66 with
    nO = 6, C = 40 with nO = 1), both layouts, a 1 x 1 map and RoIs partly or wholly off the map
    (few cases: racecheck is slow)."""
    for batch, height, width, rois in SPATIAL_CASES[:2]:
        boxes = torch.tensor(rois, device="cuda", dtype=dtype).reshape(-1, 6)
        for nO, fields in ((4, 5), (6, 11), (1, 40)):
            x = torch.randn(batch, fields * nO, height, width, device="cuda", dtype=dtype)
            for layout in (torch.contiguous_format, torch.channels_last):
                for output_size in FIXED_GRID_SIZES:
                    riroi_align_rotated(x.contiguous(memory_format=layout), boxes, output_size,
                                        0.5, 2, nO, True)
                # the any grid splits its bins into the same parts
                riroi_align_rotated(x.contiguous(memory_format=layout), boxes, (9, 9), 0.5, 0, nO)


def run_multilevel(dtype):
    features = [torch.randn(2, 16, s, s, device="cuda", dtype=dtype) for s in (12, 6, 3, 1)]
    features[0] = features[0].contiguous(memory_format=torch.channels_last)  # mixed layouts
    features = [f.requires_grad_(True) for f in features]
    rois = torch.tensor([[0, 10., 10, 8, 4, 0.2], [1, 20, 5, 16, 16, 1.0],
                         [1, -3, 40, 40, 8, -1.0]], device="cuda", dtype=dtype)
    levels = torch.tensor([0, 1, 3], device="cuda")  # level 2 has no RoI
    for deterministic, num_samples in ((False, 2), (True, 0), (False, 0), (True, 2)):
        torch.use_deterministic_algorithms(deterministic)
        try:
            out = riroi_align_rotated_multilevel(features, rois, levels,
                                                 [0.5, 0.25, 0.125, 0.0625], (3, 3), num_samples, 8)
            out.backward(torch.ones_like(out))
        finally:
            torch.use_deterministic_algorithms(False)


def run_rejected_rois():
    """Bad rows reach the forward kernels (the CUDA check is read back after them): they must skip
    NaN / inf values and bad batch or level indices without reading out of bounds."""
    for nO in (8, 40):  # the channels-last kernel and the NCHW one
        x = torch.randn(2, nO, 6, 7, device="cuda")
        for column, value in ((0, 7.0), (0, float("nan")), (1, float("nan")), (3, float("inf")),
                              (5, float("inf"))):
            rois = torch.tensor([[0, 3., 3, 4, 2, 0.5]] * 3, device="cuda")
            rois[1, column] = value
            try:
                riroi_align_rotated(x, rois, (2, 2), 0.5, 0, nO)
            except RuntimeError:
                pass
            else:
                raise AssertionError(f"rois[1, {column}] = {value} was not rejected")
    features = [torch.randn(2, 16, s, s, device="cuda") for s in (8, 4)]
    rois = torch.tensor([[0, 3., 3, 4, 2, 0.5], [1, 3, 3, 4, 2, 0.5]], device="cuda")
    try:
        riroi_align_rotated_multilevel(features, rois, torch.tensor([1, 9], device="cuda"),
                                       [0.5, 0.25], (2, 2), 0, 8)
    except RuntimeError:
        pass
    else:
        raise AssertionError("level 9 was not rejected")


BAD_VALUES = ((0, 7.0), (0, 0.5), (0, float("nan")), (1, float("nan")), (3, float("inf")),
              (5, float("inf")))


def run_captured_bad_rows():
    """Graph replays with bad rows: forward (zeros) and backward (skipped) of the channels-last
    kernels (both grids) and of the nO > 32 ones, and a bad level in the multi-level op."""
    for nO, num_samples in ((8, 2), (8, 0), (40, 0)):
        x = torch.randn(2, nO, 6, 7, device="cuda").requires_grad_(True)
        rois = torch.tensor([[0, 3., 3, 4, 2, 0.5]] * 3, device="cuda")
        grad = torch.ones(3, nO, 2, 2, device="cuda")

        def step(x, rois, grad):
            out = riroi_align_rotated(x, rois, (2, 2), 0.5, num_samples, nO)
            return (out, *torch.autograd.grad(out, x, grad))

        graph, _ = capture(step, x, rois, grad)
        for column, value in BAD_VALUES:
            good = rois[1, column].item()
            rois[1, column] = value
            graph.replay()
            rois[1, column] = good
    features = [torch.randn(2, 16, s, s, device="cuda").requires_grad_(True) for s in (8, 4)]
    rois = torch.tensor([[0, 3., 3, 4, 2, 0.5], [1, 3, 3, 4, 2, 0.5]], device="cuda")
    levels = torch.tensor([1, 0], device="cuda")
    grad = torch.ones(2, 16, 2, 2, device="cuda")

    def multilevel_step(features, rois, levels, grad):
        out = riroi_align_rotated_multilevel(features, rois, levels, [0.5, 0.25], (2, 2), 2, 8)
        return (out, *torch.autograd.grad(out, features, grad))

    graph, _ = capture(multilevel_step, features, rois, levels, grad)
    for level in (9, -1):
        levels[0] = level
        graph.replay()
    torch.cuda.synchronize()


def run():
    run_rejected_rois()
    run_captured_bad_rows()
    layouts = (torch.contiguous_format, torch.channels_last)
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for s, (batch, height, width, rois) in enumerate(SPATIAL_CASES):
            for o, (nO, fields) in enumerate(ORIENTATION_CASES):
                # every (sample grid, layout, backward mode) per dtype, spread over the cases
                variant = s + o
                run_single(dtype, batch, height, width, rois, nO, fields,
                           num_samples=(2, 0)[variant % 2], layout=layouts[(variant // 2) % 2],
                           deterministic=bool(s % 2))
                # five consecutive variants per orientation case: every (grids, mode) pair
                run_backward(dtype, batch, height, width, rois, nO, fields,
                             grids=BACKWARD_GRIDS[variant % 2],
                             deterministic=bool((variant // 2) % 2))
        run_bin_parts_forward(dtype)
        run_multilevel(dtype)
    torch.cuda.synchronize()
    print("sanitize_riroi_align_rotated: done")


if __name__ == "__main__":
    run()
