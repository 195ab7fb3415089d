"""Why the public backward (through autograd) took longer on the GPU than the raw backward op:
for the flow projection and RoIPool, each backward timed three ways: the benchmarks' way (L2
flush, the GPU queue kept ahead of the host: benchmarks/_timing.py), with the flush only (the
host's time then shows as idle GPU time where it exceeds the flush's), and per kernel
(torch.profiler); plus the host time per call of an autograd.grad through one multiplication of
the same size (the engine's own cost) and the flush's own duration. Also the filling forward's
kernels per dtype. Diagnostic only: nothing here is a goal.
Usage (repo root): python -m benchmarks.diagnose_backward_gap --out backward_gap_h200.json"""
import argparse

import torch

from benchmarks._timing import (autograd_backward, back_to_back_us, flush_l2, kernel_times_us,
                                require_cuda, time_cuda, write_json)
from benchmarks.bench_roi_pool import SCALE, SIZE, make_inputs
from benchmarks.flow_inputs import SHAPES, benchmark_case
from redet_plugin.ops import depth_flow_projection, roi_pool

T = 0.5


def describe(name, public, raw, like):
    """The three timings of both backwards, and the engine's cost for a tensor like `like`."""
    x = like.detach().clone().requires_grad_(True)
    doubled = x * 2
    trivial = autograd_backward(doubled, x, torch.randn_like(doubled))
    row = dict(case=name)
    for label, fn in (("public", public), ("raw", raw), ("trivial_autograd", trivial)):
        row[f"{label}_ms"] = time_cuda(fn)
        row[f"{label}_flush_only_ms"] = time_cuda(fn, queue_ahead=False)
        row[f"{label}_host_us"] = back_to_back_us(fn)
        if label != "trivial_autograd":
            row[f"{label}_kernels"] = kernel_times_us(fn)  # the L2 flush's fill kernel included
    print(row, flush=True)
    return row


def flow_case(shape, kind):
    batch, height, width = SHAPES[shape]
    flow, depth = benchmark_case(kind, batch, height, width, T)
    f, d = flow.clone().requires_grad_(True), depth.clone().requires_grad_(True)
    grad = torch.randn_like(flow)
    public = autograd_backward(depth_flow_projection(f, d, T, fill_holes=False), (f, d), grad)
    out, count = torch.ops.redet.depth_flow_projection(flow, depth, T, False, False, True)
    raw = lambda: torch.ops.redet._depth_flow_projection_backward(  # noqa: E731
        grad, flow, depth, out, count, T, False, False)
    return describe(f"flow {shape} {kind}", public, raw, flow)


def flow_forward_kernels(shape, kind):
    """Per-kernel time of the filling forward in each dtype (fp16/bf16 were slower than fp32)."""
    batch, height, width = SHAPES[shape]
    flow, depth = benchmark_case(kind, batch, height, width, T)
    row = dict(case=f"flow forward fill {shape} {kind}")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        f, d = flow.to(dtype), depth.to(dtype)
        fn = lambda: depth_flow_projection(f, d, T, fill_holes=True)  # noqa: E731
        row[f"{dtype}_ms"] = time_cuda(fn)
        row[f"{dtype}_kernels"] = kernel_times_us(fn)
    print(row, flush=True)
    return row


def roi_pool_case(dtype):
    x, rois = make_inputs(dtype)
    leaf = x.clone().requires_grad_(True)
    out = roi_pool(leaf, rois, SIZE, SCALE)
    grad = torch.randn_like(out)
    public = autograd_backward(out, leaf, grad)
    _, argmax = torch.ops.redet.roi_pool(x, rois, SCALE, SIZE, SIZE)
    n, c, h, w = x.shape
    raw = lambda: torch.ops.redet._roi_pool_backward(grad, rois, argmax, n, c, h, w)  # noqa: E731
    return describe(f"roi_pool {dtype}", public, raw, x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    require_cuda("diagnose_backward_gap")
    flush_ms = time_cuda(flush_l2)
    flush_kernels = kernel_times_us(lambda: None)
    rows = []
    for case in (lambda: flow_case("256x448", "smooth"), lambda: flow_case("4K", "pan"),
                 lambda: flow_case("4K", "smooth"), lambda: flow_case("1080p", "pan"),
                 lambda: flow_case("256x448", "pan"),
                 lambda: flow_forward_kernels("4K", "incoherent"),
                 lambda: flow_forward_kernels("256x448", "smooth"),
                 lambda: roi_pool_case(torch.float32), lambda: roi_pool_case(torch.float16)):
        try:
            rows.append(case())
        except Exception as error:  # noqa: BLE001  (a diagnostic: record and go on)
            rows.append(dict(error=repr(error)[:500]))
    write_json(args.out, dict(what=__doc__.splitlines()[0], flush_ms=flush_ms,
                              flush_kernels=flush_kernels, results=rows))


if __name__ == "__main__":
    main()
