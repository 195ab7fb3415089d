"""Where the CUDA depth-aware flow projection forward (+ hole filling, depth checked) spends its
GPU time: per-kernel device time (memset, scatter, mark tiles, fill holes / normalise) from
torch.profiler, L2 flushed before every call, on the smooth flow of
benchmarks/ops/bench_depth_flow_projection.py.
Also the wall time per call of 200 calls in a row (no L2 flush, one synchronisation at the end),
checked and unchecked: when that exceeds the kernels' sum, the host is the bottleneck.
Diagnostic only (the profiler's own timing, not CUDA events): it says which kernel to work on.
Usage (repo root): python -m benchmarks.profiling.profile_depth_flow_projection --out FILE.json"""
import argparse

import torch

from benchmarks._timing import back_to_back_us, environment, kernel_times_us, require_cuda, write_json
from benchmarks.ops.bench_depth_flow_projection import SHAPES, T, benchmark_case

OURS = ("redet", "Memset", "Memcpy")  # our kernels live in namespace redet; the memset


def profile_case(batch, height, width, fill):
    flow, depth = benchmark_case("smooth", batch, height, width, T)
    op = torch.ops.redet.depth_flow_projection
    return kernel_times_us(lambda: op(flow, depth, T, False, fill, True),
                           keep=lambda name: any(tag in name for tag in OURS))


def host_bound_us(batch, height, width, check):
    flow, depth = benchmark_case("smooth", batch, height, width, T)
    op = torch.ops.redet.depth_flow_projection
    return back_to_back_us(lambda: op(flow, depth, T, False, True, check))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    require_cuda("profile_depth_flow_projection")
    rows = []
    for name, shape in SHAPES.items():
        for fill in (False, True):
            row = dict(shape=name, size=list(shape), fill=fill, **profile_case(*shape, fill))
            if fill:
                row["back_to_back_us_per_call"] = {
                    "checked": host_bound_us(*shape, True), "unchecked": host_bound_us(*shape, False)}
            print(row, flush=True)
            rows.append(row)
    write_json(args.out, dict(op="depth_flow_projection (profile)", environment=environment(),
                              command="python -m benchmarks.profiling.profile_depth_flow_projection"
                              " --out " + args.out, results=rows))


if __name__ == "__main__":
    main()
