"""Depth-aware flow projection on one GPU: ours vs the plain PyTorch reference
(tests/test_ops/_reference.py: index_add scatter, cummax hole filling, autograd backward) in the
same run, and DAIN's numbers from ANCHORS.md (measured on an H200 with the same timing method).
Shapes: (4, 2, 256, 448), 1080p and 4K (batch 1). Flow: a smooth random field of up to ~5% of the
image size plus 1 px noise (the DAIN comparison); then large holes: "shift" (a half-width pan,
half the image empty), "rough" (6 px noise: scattered holes), "zoom" (contraction: holes along all
borders). Depth uniform in [1, 10]; t = 0.5.
Usage: python benchmarks/bench_depth_flow_projection.py --out benchmarks/results/depth_flow_projection_h200.json"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _timing import environment, time_cuda, write_json  # noqa: E402

import redet_plugin  # noqa: E402,F401
from tests.test_ops._reference import depth_flow_projection_reference  # noqa: E402

SHAPES = {"256x448": (4, 256, 448), "1080p": (1, 1080, 1920), "4K": (1, 2160, 3840)}
# DAIN (fp32, CUDA events, L2 flushed, median of 60) from ANCHORS.md: forward, forward + fill, backward.
DAIN_MS = {"256x448": (0.045, 0.064, 0.030), "1080p": (0.223, 0.279, 0.115), "4K": (0.976, 1.091, 0.479)}
T = 0.5


def make_inputs(batch, height, width, kind="smooth", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "smooth":
        coarse = torch.randn(batch, 2, 8, 8, device="cuda", generator=g) * 0.05 * max(height, width)
        flow = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear",
                                               align_corners=True)
        flow = flow + torch.randn(batch, 2, height, width, device="cuda", generator=g)
    elif kind == "shift":  # everything moves by half the width: half the image is one band of holes
        flow = torch.zeros(batch, 2, height, width, device="cuda")
        flow[:, 0] = 0.5 * width / T
    elif kind == "rough":  # the smooth field plus 6 px noise: holes scattered everywhere
        flow = make_inputs(batch, height, width, "smooth", seed)[0]
        flow = flow + 6 * torch.randn(batch, 2, height, width, device="cuda", generator=g)
    elif kind == "zoom":  # contraction to the centre by 40 %: holes along all borders, long runs both ways
        ys, xs = torch.meshgrid(torch.arange(height, device="cuda", dtype=torch.float32),
                                torch.arange(width, device="cuda", dtype=torch.float32), indexing="ij")
        flow = torch.stack([(width - 1) / 2 - xs, (height - 1) / 2 - ys]).expand(batch, 2, height, width)
        flow = 0.4 / T * flow + torch.randn(batch, 2, height, width, device="cuda", generator=g)
    else:
        raise ValueError(kind)
    depth = 1 + 9 * torch.rand(batch, 1, height, width, device="cuda", generator=g)
    return flow.contiguous(), depth


def deterministic(fn):
    def run():
        torch.use_deterministic_algorithms(True)
        try:
            return fn()
        finally:
            torch.use_deterministic_algorithms(False)
    return run


def graph_time(fn):
    """GPU time of fn() replayed from a CUDA graph: no Python/dispatcher overhead, which dominates
    at small sizes (our ops pass through torch.library's Python autograd layer)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return time_cuda(graph.replay)
    except Exception as error:  # noqa: BLE001  (report, do not fail the benchmark)
        return f"graph capture failed: {str(error)[:160]}"


def bench(name, batch, height, width, kind="smooth"):
    flow, depth = make_inputs(batch, height, width, kind)
    op = torch.ops.redet.depth_flow_projection
    backward = torch.ops.redet._depth_flow_projection_backward
    out_nofill, count_nofill = op(flow, depth, T, False, False, True)
    out_fill, count_fill = op(flow, depth, T, False, True, True)
    grad = torch.randn_like(flow)
    row = dict(shape=name, size=[batch, 2, height, width], flow=kind)
    row["ours_forward_ms"] = time_cuda(lambda: op(flow, depth, T, False, False, True))
    row["ours_forward_fill_ms"] = time_cuda(lambda: op(flow, depth, T, False, True, True))
    row["ours_forward_fill_unchecked_ms"] = time_cuda(lambda: op(flow, depth, T, False, True, False))
    row["ours_backward_ms"] = time_cuda(
        lambda: backward(grad, flow, depth, out_nofill, count_nofill, T, False, False))
    row["ours_backward_fill_ms"] = time_cuda(
        lambda: backward(grad, flow, depth, out_fill, count_fill, T, False, True))
    row["ours_forward_fill_unchecked_graph_ms"] = graph_time(lambda: op(flow, depth, T, False, True, False))
    row["ours_backward_graph_ms"] = graph_time(
        lambda: backward(grad, flow, depth, out_nofill, count_nofill, T, False, False))
    row["ours_deterministic_forward_fill_ms"] = time_cuda(
        deterministic(lambda: op(flow, depth, T, False, True, True)))
    row["ours_deterministic_backward_fill_ms"] = time_cuda(deterministic(  # the same gather kernels
        lambda: backward(grad, flow, depth, out_fill, count_fill, T, False, True)))

    # The plain PyTorch reference, forward and autograd backward.
    f_ref, d_ref = flow.clone().requires_grad_(True), depth.clone().requires_grad_(True)
    ref_nofill = depth_flow_projection_reference(f_ref, d_ref, T, False)[0]
    ref_fill = depth_flow_projection_reference(f_ref, d_ref, T, True)[0]
    with torch.no_grad():
        row["reference_forward_ms"] = time_cuda(lambda: depth_flow_projection_reference(flow, depth, T, False), repeats=20)
        row["reference_forward_fill_ms"] = time_cuda(lambda: depth_flow_projection_reference(flow, depth, T, True), repeats=20)
    row["reference_backward_ms"] = time_cuda(
        lambda: torch.autograd.grad(ref_nofill, (f_ref, d_ref), grad, retain_graph=True), repeats=20)
    row["max_abs_diff_vs_reference_fill"] = (out_fill - ref_fill.detach()).abs().max().item()
    row["max_abs_diff_vs_reference_nofill"] = (out_nofill - ref_nofill.detach()).abs().max().item()
    row["holes_fraction"] = (count_nofill <= 0).float().mean().item()
    row["ours_fill_cost_ms"] = row["ours_forward_fill_ms"] - row["ours_forward_ms"]

    for key in ("forward", "forward_fill", "backward"):
        row[f"speedup_{key}_vs_reference"] = row[f"reference_{key}_ms"] / row[f"ours_{key}_ms"]
    if kind == "smooth":
        dain_fwd, dain_fill, dain_bwd = DAIN_MS[name]
        row.update(dain_anchor_forward_ms=dain_fwd, dain_anchor_forward_fill_ms=dain_fill,
                   dain_anchor_backward_ms=dain_bwd,
                   speedup_forward_vs_dain=dain_fwd / row["ours_forward_ms"],
                   speedup_forward_fill_vs_dain=dain_fill / row["ours_forward_fill_ms"],
                   speedup_forward_fill_unchecked_vs_dain=dain_fill / row["ours_forward_fill_unchecked_ms"],
                   speedup_backward_vs_dain=dain_bwd / row["ours_backward_ms"])
    print(row, flush=True)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [bench(name, *shape) for name, shape in SHAPES.items()]
    for name, kind in [("1080p", "shift"), ("4K", "shift"), ("1080p", "rough"), ("1080p", "zoom"),
                       ("256x448", "rough")]:  # large holes
        rows.append(bench(name, *SHAPES[name], kind=kind))
    goals = dict(
        forward_fill_10x_reference_at_4K=rows[2]["speedup_forward_fill_vs_reference"] >= 10,
        forward_fill_2x_dain=all(r["speedup_forward_fill_vs_dain"] >= 2 for r in rows[:3]),
        backward_at_least_dain=all(r["speedup_backward_vs_dain"] >= 1 for r in rows[:3]))
    write_json(args.out, dict(op="depth_flow_projection", environment=environment(), t=T,
                              dtype="float32", goals_met=goals,
                              command="python benchmarks/bench_depth_flow_projection.py --out " + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
