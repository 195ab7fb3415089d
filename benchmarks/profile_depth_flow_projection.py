"""Where the CUDA depth-aware flow projection forward (+ hole filling, depth checked) spends its
GPU time: per-kernel device time (scatter, row pass, column pass, memset, the flag copy) from
torch.profiler, L2 flushed before every call, on the smooth flow of bench_depth_flow_projection.py.
Diagnostic only (the profiler's own timing, not CUDA events): it says which kernel to work on.
Usage: python benchmarks/profile_depth_flow_projection.py --out FILE.json"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from _timing import environment, flush_l2, write_json
from bench_depth_flow_projection import SHAPES, T, make_inputs

CALLS = 20
OURS = ("redet", "Memset", "Memcpy")  # our kernels live in namespace redet; memset/flag copy


def device_us(event):
    total = getattr(event, "device_time_total", None)
    if total is None:
        total = event.cuda_time_total
    return total / CALLS


def profile_case(batch, height, width, fill):
    flow, depth = make_inputs(batch, height, width)
    op = torch.ops.redet.depth_flow_projection

    def call():
        return op(flow, depth, T, False, fill, True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush_l2()
            call()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        if any(tag in event.key for tag in OURS) and device_us(event) > 0:
            # "void redet::(anonymous namespace)::scatter_kernel<...>(...)" -> "scatter_kernel"
            name = event.key.split("<")[0].split("::")[-1].replace("void ", "")
            kernels[name] = kernels.get(name, 0.0) + device_us(event)
    return dict(us_per_call=kernels, total_us=sum(kernels.values()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for name, shape in SHAPES.items():
        for fill in (False, True):
            row = dict(shape=name, size=list(shape), fill=fill, **profile_case(*shape, fill))
            print(row, flush=True)
            rows.append(row)
    write_json(args.out, dict(op="depth_flow_projection (profile)", environment=environment(),
                              command="python benchmarks/profile_depth_flow_projection.py --out "
                              + args.out, results=rows))


if __name__ == "__main__":
    main()
