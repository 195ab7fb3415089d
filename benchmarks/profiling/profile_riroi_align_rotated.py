"""Where the CUDA RiRoIAlignRotated spends its GPU time on the training shape of
benchmarks/ops/bench_riroi_align_rotated.py: per-kernel device time (transpose, roi check,
gather; backward scatter and conversion) from torch.profiler, L2 flushed before every call, NCHW
and channels-last input, float32 and float16 (vectorized_elementwise_kernel: the L2 flush, and in
the backward also the scratch's zeroing). Diagnostic only: it says which kernel to work on.
Usage (repo root): python -m benchmarks.profiling.profile_riroi_align_rotated --out FILE.json"""
import argparse

import torch

from benchmarks._timing import environment, kernel_times_us, require_cuda, write_json
from benchmarks.ops.bench_riroi_align_rotated import NO, OUT, SAMPLES, SCALE, make_rois


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    require_cuda("profile_riroi_align_rotated")
    rows = []
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(2, 32 * NO, 256, 256, device="cuda").to(dtype)
        x_channels_last = x.contiguous(memory_format=torch.channels_last)
        rois = make_rois(2, 512).to(dtype)
        opts = (SCALE, OUT, OUT, SAMPLES, NO, True, False)
        grad = torch.randn(rois.shape[0], x.shape[1], OUT, OUT, device="cuda").to(dtype)
        cases = dict(
            forward_nchw=lambda: torch.ops.redet.riroi_align_rotated(x, rois, *opts),
            forward_channels_last=lambda: torch.ops.redet.riroi_align_rotated(
                x_channels_last, rois, *opts),
            backward=lambda: torch.ops.redet._riroi_align_rotated_backward(
                grad, rois, SCALE, SAMPLES, NO, True, False, *x.shape))
        for name, call in cases.items():
            row = dict(case=name, dtype=str(dtype), **kernel_times_us(call))
            print(row, flush=True)
            rows.append(row)
    write_json(args.out, dict(op="riroi_align_rotated (profile)", environment=environment(),
                              command="python -m benchmarks.profiling.profile_riroi_align_rotated"
                              " --out " + args.out, results=rows))


if __name__ == "__main__":
    main()
