"""Small RoIPool runs for compute-sanitizer (memcheck, racecheck): every CUDA kernel (channels-last
forward with its shared-memory tiles on both paths, backward, deterministic backward) on edge cases.
Forward paths (csrc/roi_pool/cuda/roi_pool_forward.cu): the vector path (2 channels a lane) for
float, half and bfloat16 with an even C and an aligned data pointer; the scalar path for double, odd
C and a channels-last view at an odd storage offset (misaligned pairs). Every case runs on NCHW input
(the transpose kernel), channels-last input, and the misaligned channels-last view. Bad RoI rows
(NaN/inf, batch index out of range or not an integer) reach the kernels twice: in eager calls
(the check raises after them) and in replays of a captured CUDA graph (nothing checks). The
multi-level op runs the same forward over several maps: RoIs at every level but one, on both
paths and every layout, and bad levels in eager calls and graph replays.
Usage (repo root):
    compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_roi_pool"""

import torch

import redet_plugin.ops  # noqa: F401
from redet_plugin.testing import capture, channels_last_at_offset

BAD_VALUES = [(0, 7.0), (0, -1.0), (0, 0.5), (0, float("nan")), (2, float("nan")),
              (4, float("inf"))]


LAYOUTS = {
    "nchw": lambda x: x,
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    "channels_last_misaligned": lambda x: channels_last_at_offset(x, 1),
}


def run():
    cases = [  # (input, rois, output_size)
        (torch.randn(2, 3, 9, 11), torch.tensor([[0, 1., 1, 8, 6], [1, -5, -5, 30, 30], [0, 6, 6, 2, 2]]),
         (2, 3)),
        (torch.randn(1, 2, 1, 1), torch.tensor([[0, 0., 0, 0, 0]]), (2, 3)),       # 1x1 map
        (torch.randn(1, 2, 5, 5), torch.zeros(0, 5), (2, 3)),                      # no RoIs
        (torch.randn(1, 2, 5, 5), torch.tensor([[0, 50., 50, 60, 60]]), (2, 3)),   # fully off the map
        # 33 channels: a partial chunk; 11 bins a row: two bin groups
        (torch.randn(2, 33, 7, 6), torch.tensor([[1, 0., 0, 12, 12], [0, 3, 2, 9, 11]]), (3, 11)),
        # 66 channels: the vector path's last chunk holds one pair (one active lane)
        (torch.randn(2, 66, 7, 6), torch.tensor([[1, 0., 0, 12, 12], [0, 3, 2, 9, 11]]), (3, 11)),
        (torch.randn(1, 64, 4, 4), torch.tensor([[0, 0., 0, 7, 7]] * 9), (7, 7)),  # several blocks
        (torch.full((1, 20, 4, 4), float("nan")), torch.tensor([[0, 0., 0, 3, 3]]), (2, 2)),  # all NaN
    ]
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for x, rois, output_size in cases:
            for layout in LAYOUTS.values():
                xd = layout(x.to("cuda", dtype)).detach().requires_grad_(True)
                for deterministic in (False, True):
                    torch.use_deterministic_algorithms(deterministic)
                    out = redet_plugin.ops.roi_pool(xd, rois.to("cuda", dtype), output_size, 0.5)
                    out.backward(torch.ones_like(out))
                torch.use_deterministic_algorithms(False)
    run_bad_rows()
    run_multilevel()
    torch.cuda.synchronize()
    print("sanitize_roi_pool: done")


def run_bad_rows():
    """Bad rows in eager calls (raised after the kernel) and in graph replays (guards only), on the
    vector path (float, even C) and the scalar path (double), forward and backward."""
    for dtype, layout in ((torch.float32, LAYOUTS["nchw"]),
                          (torch.float64, LAYOUTS["channels_last"]),
                          (torch.float16, LAYOUTS["channels_last"])):
        x = layout(torch.randn(2, 66, 7, 6, device="cuda", dtype=dtype)).detach()
        x.requires_grad_(True)
        rois = torch.tensor([[0, 1., 1, 8, 6], [1, 0, 0, 12, 12], [0, 3, 2, 9, 11]],
                            device="cuda", dtype=dtype)
        grad = torch.ones(3, 66, 3, 2, device="cuda", dtype=dtype)

        def step(x, rois, grad):
            out = redet_plugin.ops.roi_pool(x, rois, (3, 2), 0.5)
            return (out, *torch.autograd.grad(out, x, grad))

        for column, value in BAD_VALUES:
            bad = rois.clone()
            bad[1, column] = value
            try:
                step(x, bad, grad)
            except RuntimeError:
                pass
            else:
                raise AssertionError(f"rois[1, {column}] = {value} was not rejected")
        graph, _ = capture(step, x, rois, grad)
        for column, value in BAD_VALUES:
            good = rois[1, column].item()
            rois[1, column] = value
            graph.replay()
            rois[1, column] = good
        torch.cuda.synchronize()


def run_multilevel():
    sizes, scales = [(9, 11), (5, 6), (3, 3)], [0.5, 0.25, 0.125]
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for channels in (3, 66):
            for layout in LAYOUTS.values():
                feats = [layout(torch.randn(2, channels, h, w, device="cuda", dtype=dtype))
                         .detach().requires_grad_(True) for h, w in sizes]
                rois = torch.tensor([[0, 1., 1, 8, 6], [1, -5, -5, 30, 30], [0, 6, 6, 2, 2],
                                     [1, 0, 0, 12, 12]], device="cuda", dtype=dtype)
                levels = torch.tensor([0, 2, 0, 2], device="cuda")  # level 1 has none
                out = redet_plugin.ops.roi_pool_multilevel(feats, rois, levels, scales, (3, 11))
                out.backward(torch.ones_like(out))
    feats = [torch.randn(2, 66, h, w, device="cuda").requires_grad_(True) for h, w in sizes]
    rois = torch.tensor([[0, 1., 1, 8, 6], [1, 0, 0, 12, 12]], device="cuda")
    levels = torch.tensor([0, 2], device="cuda")
    grad = torch.ones(2, 66, 3, 2, device="cuda")

    def step(rois, levels, grad):
        out = redet_plugin.ops.roi_pool_multilevel(feats, rois, levels, scales, (3, 2))
        return (out, *torch.autograd.grad(out, feats, grad))

    for bad_level in (-1, 3):
        try:
            step(rois, torch.tensor([0, bad_level], device="cuda"), grad)
        except RuntimeError:
            pass
        else:
            raise AssertionError(f"level {bad_level} was not rejected")
    graph, _ = capture(step, rois, levels, grad)
    for bad_level in (-1, 3):
        levels[1] = bad_level
        graph.replay()
    levels[1] = 2
    torch.cuda.synchronize()


if __name__ == "__main__":
    run()
