"""Rotated RoI extraction over an FPN on one GPU: the fused multi-level RiRoIAlignRotated launch vs
the per-level loop (same op, same inputs, both through RotatedSingleRoIExtractor), and mmrotate's
way (the loop around mmcv's RiRoIAlignRotated) as the peer, in the same run.

Inputs: a 1024^2 image, 5 FPN levels (strides 4..64), 256 channels = 32 fields x 8 orientations;
RiRoIAlignRotated(7x7, num_samples=2, nO=8, clockwise=True) as in ReDet. Cases: training (2 images,
1024 RoIs) and testing (1 image, 2000 RoIs); RoI sizes sqrt(w*h) log-uniform in [16, 1024] px so
that every level gets RoIs, centres uniform in the image, theta uniform in [-pi, pi).
Forward = the extractor's forward (level choice included); forward+backward also computes the
feature gradients (torch.autograd.grad, no accumulation); `*_host_us`: the host's time per call
of calls back to back (no flush).
Usage (repo root): python -m benchmarks.ops.bench_rotated_extractor --out rotated_extractor_h200.json"""
import math

import torch

from benchmarks._timing import (back_to_back_us, dtype_name, environment, require_cuda, time_cuda,
                                write_json)
from benchmarks.ops._extractor_inputs import (CASES, CHANNELS, DTYPES, IMAGE, add_speedups,
                                              maps_and_boxes, parse_args)
from redet_plugin.models.roi_heads.roi_extractors import RotatedSingleRoIExtractor
from redet_plugin.ops import RiRoIAlignRotated

STRIDES = [4, 8, 16, 32, 64]
LAYER = dict(output_size=7, num_samples=2, num_orientations=8, clockwise=True)
GOAL = 2.0


def make_inputs(num_images, num_rois, dtype, seed=0):
    feats, (index, centre, w, h), g = maps_and_boxes(num_images, num_rois, STRIDES, seed)
    theta = (torch.rand(num_rois, device="cuda", generator=g) * 2 - 1) * math.pi
    rois = torch.stack([index, centre[:, 0], centre[:, 1], w, h, theta], 1)
    return [f.to(dtype) for f in feats], rois.to(dtype)


def extractors():
    ours = dict(type=RiRoIAlignRotated, **LAYER)
    found = dict(fused=RotatedSingleRoIExtractor(ours, CHANNELS, STRIDES, fused=True),
                 loop=RotatedSingleRoIExtractor(ours, CHANNELS, STRIDES, fused=False))
    try:
        from mmcv.ops import RiRoIAlignRotated as MmcvRiRoI
        found["mmcv_loop"] = RotatedSingleRoIExtractor(
            dict(type=MmcvRiRoI, out_size=7, num_samples=2, num_orientations=8, clockwise=True),
            CHANNELS, STRIDES)
    except ImportError:
        pass
    return {name: e.cuda() for name, e in found.items()}


def ops_only_forward(feats, rois, repeats):
    """The kernels alone, RoIs already split by level: what the loop costs beyond its launches."""
    from redet_plugin.ops import riroi_align_rotated, riroi_align_rotated_multilevel
    levels = RotatedSingleRoIExtractor(dict(type=RiRoIAlignRotated, **LAYER), CHANNELS,
                                       STRIDES).map_roi_levels(rois, len(STRIDES))
    scales = [1.0 / s for s in STRIDES]
    split = [(feats[i], rois[levels == i], scales[i]) for i in range(len(STRIDES))]
    options = dict(num_samples=2, num_orientations=8, clockwise=True)
    return dict(
        ops_only_fused_forward_ms=time_cuda(lambda: riroi_align_rotated_multilevel(
            feats, rois, levels, scales, 7, **options), repeats),
        ops_only_per_level_forward_ms=time_cuda(lambda: [riroi_align_rotated(
            f, r, 7, s, **options) for f, r, s in split], repeats))


def bench_case(name, num_images, num_rois, dtype, repeats):
    feats, rois = make_inputs(num_images, num_rois, dtype)
    feats_grad = [f.detach().requires_grad_(True) for f in feats]
    row = dict(case=name, images=num_images, rois=num_rois, dtype=dtype_name(dtype))
    fused_out = None
    for label, extractor in extractors().items():
        try:
            out = extractor(feats, rois)
            grad_out = torch.randn_like(out)

            def forward_backward():
                torch.autograd.grad(extractor(feats_grad, rois), feats_grad, grad_out)

            row[f"{label}_forward_ms"] = time_cuda(lambda: extractor(feats, rois), repeats)
            row[f"{label}_forward_backward_ms"] = time_cuda(forward_backward, repeats)
            row[f"{label}_forward_host_us"] = back_to_back_us(lambda: extractor(feats, rois))
            row[f"{label}_forward_backward_host_us"] = back_to_back_us(forward_backward)
        except Exception as error:  # noqa: BLE001  (report the peer's failure, keep measuring ours)
            row[f"{label}_error"] = str(error)[:200]
            continue
        if label == "fused":
            fused_out = out
            row["rois_per_level"] = torch.bincount(
                extractor.map_roi_levels(rois, len(STRIDES)), minlength=len(STRIDES)).tolist()
        elif label == "loop" and fused_out is not None:
            row["max_abs_diff_fused_vs_loop"] = float((fused_out - out).abs().max())
    row.update(ops_only_forward(feats, rois, repeats))
    add_speedups(row, "fused", ("loop", "mmcv_loop"))
    row["goal_met"] = all(row.get(f"speedup_{w}_fused_vs_loop", 0) >= GOAL
                          for w in ("forward", "forward_backward"))
    return row


def goals(rows):
    met = {f"{r['case']}_{r['dtype']}_fused_{GOAL}x_loop": r["goal_met"] for r in rows}
    fp32 = {r["case"]: r for r in rows if r["dtype"] == "float32"}
    for r in rows:
        if r["dtype"] != "float32":
            for what in ("forward", "forward_backward"):
                key = f"fused_{what}_ms"
                if key in r and key in fp32[r["case"]]:
                    met[f"{r['case']}_{r['dtype']}_{what}_not_slower_than_fp32"] = (
                        r[key] <= fp32[r["case"]][key])
    return met


def main():
    args = parse_args()
    require_cuda("bench_rotated_extractor")
    torch.backends.cudnn.benchmark = False
    rows = [bench_case(name, n, k, dtype, args.repeats) for dtype in DTYPES for name, n, k in CASES]
    write_json(args.out, dict(
        what="RotatedSingleRoIExtractor: fused multi-level RiRoIAlignRotated vs per-level loop",
        environment=environment(), goal=f"fused >= {GOAL}x faster than the loop",
        goals_met=goals(rows),
        shape=f"{IMAGE}^2 image, strides {STRIDES}, {CHANNELS} ch = 32 x 8 orientations, 7x7, "
              "2 samples, clockwise",
        command="python -m benchmarks.ops.bench_rotated_extractor --out " + args.out, results=rows))


if __name__ == "__main__":
    main()
