"""The CUDA flow projection's backward as users call it: the public depth_flow_projection with
requires_grad inputs, then torch.autograd.grad, beside DAIN's backward kernel (ANCHORS.md, same
timing method) on the flow fields of that comparison: smooth motion + 1 px noise at
(4, 2, 256, 448), smooth at 4K, a global pan (a wide band of holes) at 4K, incoherent flow
(smooth + 8 px noise per pixel) at 1080p and 4K; t = 0.5. Per case and hole filling on/off:
- autograd_ms: CUDA events around torch.autograd.grad, L2 flushed, median (what users get);
- autograd_ones_ms: the same with an expanded grad_output (as from .sum()), read in place;
- op_ms: the backward op called directly (no autograd engine): the difference is host time the
  flush did not hide;
- kernels: each kernel's device time (torch.profiler, diagnostic) and host_us_per_call, the
  wall time per autograd call over many calls in a row.
DAIN's backward has no hole filling, so the speed-up is computed without it.
Usage: python benchmarks/profile_depth_flow_projection_backward.py --out FILE.json"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import back_to_back_us, environment, kernel_times_us, time_cuda, write_json  # noqa: E402
from bench_depth_flow_projection import SHAPES, T, make_inputs  # noqa: E402

from redet_plugin.ops import depth_flow_projection  # noqa: E402

# (shape, flow, DAIN backward ms from ANCHORS.md)
CASES = [("256x448", "smooth", 0.030), ("4K", "smooth", 0.406), ("4K", "shift", 0.368),
         ("1080p", "incoherent", 0.114), ("4K", "incoherent", 0.447)]
GOAL = 1.2  # at least this much faster than DAIN in every case


def inputs(name, kind):
    batch, height, width = SHAPES[name]
    if kind != "incoherent":
        return make_inputs(batch, height, width, kind)
    flow, depth = make_inputs(batch, height, width, "smooth")
    g = torch.Generator(device="cuda").manual_seed(1)
    return flow + 8 * torch.randn(flow.shape, device="cuda", generator=g), depth


def case(name, kind, dain_ms):
    flow, depth = inputs(name, kind)
    grad = torch.randn_like(flow)
    ones = torch.ones(1, 1, 1, 1, device="cuda").expand_as(flow)
    backward = torch.ops.redet._depth_flow_projection_backward
    row = dict(shape=name, size=list(flow.shape), flow=kind, dain_backward_ms=dain_ms)
    for fill in (False, True):
        f, d = flow.clone().requires_grad_(True), depth.clone().requires_grad_(True)
        out = depth_flow_projection(f, d, T, fill)
        autograd = lambda: torch.autograd.grad(out, (f, d), grad, retain_graph=True)  # noqa: E731
        out_op, count_op = torch.ops.redet.depth_flow_projection(flow, depth, T, False, fill, True)
        key = "fill" if fill else "no_fill"
        row[key] = dict(
            autograd_ms=time_cuda(autograd),
            autograd_ones_ms=time_cuda(
                lambda: torch.autograd.grad(out, (f, d), ones, retain_graph=True)),
            op_ms=time_cuda(lambda: backward(grad, flow, depth, out_op, count_op, T, False, fill)),
            kernels=kernel_times_us(autograd, keep=lambda n: "redet" in n),
            host_us_per_call=back_to_back_us(autograd))
    row["speedup_vs_dain"] = dain_ms / row["no_fill"]["autograd_ms"]
    print(row, flush=True)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [case(*c) for c in CASES]
    write_json(args.out, dict(
        op="depth_flow_projection backward (autograd)", environment=environment(), t=T,
        dtype="float32", goal=f">= {GOAL}x DAIN's backward in every case",
        goal_met=all(r["speedup_vs_dain"] >= GOAL for r in rows),
        command="python benchmarks/profile_depth_flow_projection_backward.py --out " + args.out,
        results=rows))


if __name__ == "__main__":
    main()
