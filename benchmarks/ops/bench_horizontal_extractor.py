"""Horizontal RoI extraction over an FPN on one GPU (ReDet's first stage): RoIPool over every level
in one launch (ops.roi_pool_multilevel) against the same op pooling all RoIs at every level with
those of other levels parked (the extractor's way for layers without a multi-level kernel), both
through HorizontalSingleRoIExtractor, and mmdet's SingleRoIExtractor around mmcv's RoIPool (how
mmrotate's ReDet pools) as the peer, in the same run.

Inputs: a 1024^2 image, 4 FPN levels (strides 4..32), 256 channels, RoIPool 7x7, as in
configs/_base_/models/redet-le90_re50_refpn.py. Cases: training (2 images, 1024 RoIs) and testing
(1 image, 2000 RoIs); RoI sides sqrt(w*h) log-uniform in [16, 1024] px so that every level gets
RoIs, centres uniform in the image, aspect in [0.5, 2]. Forward = the extractor's forward (level
choice included); forward+backward also computes the feature gradients.
Usage (repo root): python -m benchmarks.ops.bench_horizontal_extractor --out horizontal_extractor_h200.json
"""
import torch

from benchmarks._timing import dtype_name, environment, require_cuda, time_cuda, write_json
from benchmarks.ops._extractor_inputs import (CASES, CHANNELS, DTYPES, IMAGE, add_speedups,
                                              maps_and_boxes, parse_args)

STRIDES = [4, 8, 16, 32]


def make_inputs(num_images, num_rois, dtype, seed=0):
    feats, (index, centre, w, h), _ = maps_and_boxes(num_images, num_rois, STRIDES, seed)
    half = torch.stack([w, h], 1) / 2
    rois = torch.cat([index[:, None], (centre - half).clamp(0, IMAGE),
                      (centre + half).clamp(0, IMAGE)], 1)
    return [f.to(dtype) for f in feats], rois.to(dtype)


def extractors():
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor

    from redet_plugin.models.roi_heads.roi_extractors import HorizontalSingleRoIExtractor
    from redet_plugin.ops import RoIPool
    layer = dict(type=RoIPool, output_size=7)
    fused = HorizontalSingleRoIExtractor(layer, CHANNELS, STRIDES)
    parked = HorizontalSingleRoIExtractor(layer, CHANNELS, STRIDES)
    parked.fused_kernel = None  # (the parked path: what a layer without a multi-level kernel gets)
    found = dict(fused=fused, parked=parked)
    try:
        found["mmdet_mmcv"] = SingleRoIExtractor(dict(type="RoIPool", output_size=7), CHANNELS,
                                                 STRIDES)
    except (ImportError, KeyError):
        pass
    return {name: e.cuda() for name, e in found.items()}


def bench_case(name, num_images, num_rois, dtype, repeats):
    feats, rois = make_inputs(num_images, num_rois, dtype)
    feats_grad = [f.detach().requires_grad_(True) for f in feats]
    row = dict(case=name, images=num_images, rois=num_rois, dtype=dtype_name(dtype))
    outputs = {}
    for label, extractor in extractors().items():
        try:
            outputs[label] = extractor(feats, rois)
            grad_out = torch.randn_like(outputs[label])

            def forward_backward():
                torch.autograd.grad(extractor(feats_grad, rois), feats_grad, grad_out)

            row[f"{label}_forward_ms"] = time_cuda(lambda: extractor(feats, rois), repeats)
            row[f"{label}_forward_backward_ms"] = time_cuda(forward_backward, repeats)
        except Exception as error:  # noqa: BLE001  (report the peer's failure, keep measuring ours)
            row[f"{label}_error"] = str(error)[:200]
    for peer in ("parked", "mmdet_mmcv"):
        if peer in outputs and "fused" in outputs:
            row[f"max_abs_diff_fused_vs_{peer}"] = float((outputs["fused"] - outputs[peer])
                                                         .abs().max())
    add_speedups(row, "fused", ("parked", "mmdet_mmcv"))
    return row


def main():
    args = parse_args()
    require_cuda("bench_horizontal_extractor")
    rows = [bench_case(name, n, k, dtype, args.repeats) for dtype in DTYPES for name, n, k in CASES]
    write_json(args.out, dict(
        what="HorizontalSingleRoIExtractor: RoIPool over all levels in one launch vs the parked "
             "per-level calls, and mmdet's SingleRoIExtractor with mmcv's RoIPool",
        environment=environment(),
        shape=f"{IMAGE}^2 image, strides {STRIDES}, {CHANNELS} channels, RoIPool 7x7",
        command="python -m benchmarks.ops.bench_horizontal_extractor --out " + args.out,
        results=rows))


if __name__ == "__main__":
    main()
