"""RiRoIAlignRotated on one GPU: ours (forward, fast backward, deterministic backward) vs mmcv's
CUDA op in the same run. Shapes from ANCHORS.md:
  train: features (2, 256, 256, 256) = 32 fields x 8 orientations, 1024 RoIs (512 per image,
         centres uniform in 1024^2, w, h in [16, 256] px, theta in [-pi, pi)), scale 0.25, 7x7,
         2 samples per bin side;
  test:  1 image, 2000 RoIs, same map (forward only).
The forward reads channels-last features: ours is timed with NCHW input (the op's transpose to
channels-last included: `ours_forward_ms`) and with channels-last input (`ours_forward_channels_last_ms`,
no copy); `transpose_ms` is that transpose alone. mmcv reads NCHW.
Also: the fused multi-level op vs a per-level loop (FPN strides 4-32 of a 1024^2 image), and
CPU (2 threads) vs the plain reference on a small shape.
Usage: python benchmarks/bench_riroi_align_rotated.py --out benchmarks/results/riroi_align_rotated_h200.json"""
import argparse
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _timing import environment, peak_extra_memory_mb, time_cuda, write_json  # noqa: E402

import redet_plugin  # noqa: E402,F401

SCALE, OUT, SAMPLES, NO = 0.25, 7, 2, 8


def make_rois(num_images, per_image, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    k = num_images * per_image
    batch = (torch.arange(k, device=device) // per_image).double()[:, None]
    centre = torch.rand(k, 2, device=device, generator=g, dtype=torch.float64) * 1024
    size = 16 + torch.rand(k, 2, device=device, generator=g, dtype=torch.float64) * 240
    theta = (torch.rand(k, 1, device=device, generator=g, dtype=torch.float64) * 2 - 1) * math.pi
    return torch.cat([batch, centre, size, theta], dim=1)


def mmcv_peer():
    """mmcv's raw kernels (None when mmcv has no CUDA ops), called as its autograd Function does."""
    try:
        from mmcv.utils import ext_loader
        ext = ext_loader.load_ext("_ext", ["riroi_align_rotated_forward",
                                           "riroi_align_rotated_backward"])
    except Exception:  # noqa: BLE001
        return None

    def forward(x, rois):
        out = x.new_zeros(rois.shape[0], x.shape[1], OUT, OUT)
        ext.riroi_align_rotated_forward(x, rois, out, pooled_height=OUT, pooled_width=OUT,
                                        spatial_scale=SCALE, num_samples=SAMPLES,
                                        num_orientations=NO, clockwise=True)
        return out

    def backward(grad, rois, shape):
        grad_input = rois.new_zeros(shape)
        ext.riroi_align_rotated_backward(grad, rois, grad_input, pooled_height=OUT,
                                         pooled_width=OUT, spatial_scale=SCALE,
                                         num_samples=SAMPLES, num_orientations=NO, clockwise=True)
        return grad_input
    return forward, backward


def ratio(row, peer_key, ours_key, name):
    if peer_key in row and ours_key in row:
        row[name] = row[peer_key] / row[ours_key]


def bench_shape(name, num_images, per_image, dtype, peer, with_backward=True):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(num_images, 32 * NO, 256, 256, device="cuda", generator=g).to(dtype)
    x_channels_last = x.contiguous(memory_format=torch.channels_last)
    rois = make_rois(num_images, per_image).to(dtype)
    args = (SCALE, OUT, OUT, SAMPLES, NO, True, False)
    ours = lambda: torch.ops.redet.riroi_align_rotated(x, rois, *args)  # noqa: E731
    ours_channels_last = lambda: torch.ops.redet.riroi_align_rotated(  # noqa: E731
        x_channels_last, rois, *args)
    row = dict(shape=name, dtype=str(dtype).replace("torch.", ""))
    row["ours_forward_ms"] = time_cuda(ours)  # NCHW input: includes the transpose
    row["ours_forward_peak_extra_mb"] = peak_extra_memory_mb(ours)
    row["ours_forward_channels_last_ms"] = time_cuda(ours_channels_last)
    row["ours_forward_channels_last_peak_extra_mb"] = peak_extra_memory_mb(ours_channels_last)
    row["transpose_ms"] = time_cuda(lambda: x.contiguous(memory_format=torch.channels_last))
    row["channels_last_equals_nchw"] = bool(torch.equal(ours(), ours_channels_last()))
    if with_backward:
        grad = torch.randn(rois.shape[0], x.shape[1], OUT, OUT, device="cuda").to(dtype)
        bwd = lambda: torch.ops.redet._riroi_align_rotated_backward(  # noqa: E731
            grad, rois, SCALE, SAMPLES, NO, True, False, *x.shape)
        row["ours_backward_ms"] = time_cuda(bwd)
        row["ours_backward_peak_extra_mb"] = peak_extra_memory_mb(bwd)
        torch.use_deterministic_algorithms(True)
        try:
            row["ours_backward_deterministic_ms"] = time_cuda(bwd)
            row["ours_backward_deterministic_peak_extra_mb"] = peak_extra_memory_mb(bwd)
        finally:
            torch.use_deterministic_algorithms(False)
    if peer is not None and dtype != torch.bfloat16:  # mmcv has no bfloat16 kernel
        try:
            forward, backward = peer
            row["mmcv_forward_ms"] = time_cuda(lambda: forward(x, rois))
            row["mmcv_forward_peak_extra_mb"] = peak_extra_memory_mb(lambda: forward(x, rois))
            if with_backward:
                row["mmcv_backward_ms"] = time_cuda(lambda: backward(grad, rois, x.shape))
                row["mmcv_backward_peak_extra_mb"] = peak_extra_memory_mb(
                    lambda: backward(grad, rois, x.shape))
            # legacy_orientation=True is the peer's function: check it while we are here
            legacy = torch.ops.redet.riroi_align_rotated(x, rois, SCALE, OUT, OUT, SAMPLES, NO,
                                                         True, True)
            peer_out = forward(x, rois)
            row["legacy_vs_mmcv_max_rel_diff"] = ((legacy.float() - peer_out.float()).abs().max()
                                                  / peer_out.float().abs().max()).item()
        except Exception as error:  # noqa: BLE001  (report, do not fail the benchmark)
            row["mmcv_error"] = str(error)[:200]
    ratio(row, "mmcv_forward_ms", "ours_forward_ms", "speedup_forward_vs_mmcv")
    ratio(row, "mmcv_forward_ms", "ours_forward_channels_last_ms",
          "speedup_forward_channels_last_vs_mmcv")
    ratio(row, "mmcv_backward_ms", "ours_backward_ms", "speedup_backward_vs_mmcv")
    ratio(row, "mmcv_backward_ms", "ours_backward_deterministic_ms",
          "speedup_deterministic_backward_vs_mmcv")
    return row


def bench_multilevel(dtype):
    """4 FPN levels of two 1024^2 images; RoIs mapped to levels by mmdet's scale rule."""
    g = torch.Generator(device="cuda").manual_seed(2)
    features = [torch.randn(2, 32 * NO, 1024 // s, 1024 // s, device="cuda", generator=g).to(dtype)
                for s in (4, 8, 16, 32)]
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    rois = make_rois(2, 512).to(dtype)
    levels = torch.floor(torch.log2(torch.sqrt(rois[:, 3].double() * rois[:, 4].double()) / 56 + 1e-6))
    levels = levels.clamp(0, 3).long()
    opts = (OUT, OUT, SAMPLES, NO, True, False)
    fused = lambda: torch.ops.redet.riroi_align_rotated_multilevel(  # noqa: E731
        features, rois, levels, scales, *opts)
    features_channels_last = [f.contiguous(memory_format=torch.channels_last) for f in features]
    fused_channels_last = lambda: torch.ops.redet.riroi_align_rotated_multilevel(  # noqa: E731
        features_channels_last, rois, levels, scales, *opts)
    index = [(levels == l).nonzero().flatten() for l in range(4)]

    def loop():
        out = features[0].new_zeros(rois.shape[0], features[0].shape[1], OUT, OUT)
        for l, (f, s) in enumerate(zip(features, scales)):
            out[index[l]] = torch.ops.redet.riroi_align_rotated(f, rois[index[l]], s, *opts)
        return out
    grad = torch.randn(rois.shape[0], features[0].shape[1], OUT, OUT, device="cuda").to(dtype)
    heights, widths = [f.shape[2] for f in features], [f.shape[3] for f in features]
    fused_bwd = lambda: torch.ops.redet._riroi_align_rotated_multilevel_backward(  # noqa: E731
        grad, rois, levels, scales, SAMPLES, NO, True, False, 2, features[0].shape[1], heights, widths)

    def loop_bwd():
        return [torch.ops.redet._riroi_align_rotated_backward(
            grad[index[l]], rois[index[l]], s, SAMPLES, NO, True, False, *f.shape)
            for l, (f, s) in enumerate(zip(features, scales))]
    row = dict(shape="multilevel: 4 levels (2,256,{256,128,64,32}^2), 1024 rois", dtype=str(dtype).replace("torch.", ""),
               rois_per_level=[int(i.numel()) for i in index],
               fused_forward_ms=time_cuda(fused), loop_forward_ms=time_cuda(loop),
               fused_forward_channels_last_ms=time_cuda(fused_channels_last),
               fused_forward_channels_last_peak_extra_mb=peak_extra_memory_mb(fused_channels_last),
               fused_backward_ms=time_cuda(fused_bwd), loop_backward_ms=time_cuda(loop_bwd))
    row["fused_vs_loop_max_abs_diff"] = (fused() - loop()).abs().max().item()
    row["fused_channels_last_equals_nchw"] = bool(torch.equal(fused(), fused_channels_last()))
    return row


def bench_cpu():
    """2 threads, small shape: our CPU kernel vs the plain reference (tests/test_ops/_reference.py)."""
    from tests.test_ops._reference import riroi_align_rotated_reference
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(1, 8 * NO, 64, 64, generator=g)
        rois = make_rois(1, 64, device="cpu")
        rois[:, 1:3] /= 4  # centres on the 256^2 image of a 64^2 map
        rois = rois.float()

        def timed(fn, repeats=5):
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return sorted(times)[len(times) // 2] * 1000
        ours = timed(lambda: torch.ops.redet.riroi_align_rotated(x, rois, SCALE, OUT, OUT, SAMPLES,
                                                                 NO, True, False))
        grad = torch.randn(64, 8 * NO, OUT, OUT)
        ours_bwd = timed(lambda: torch.ops.redet._riroi_align_rotated_backward(
            grad, rois, SCALE, SAMPLES, NO, True, False, *x.shape))
        ref = timed(lambda: riroi_align_rotated_reference(x, rois, (OUT, OUT), SCALE, SAMPLES, NO,
                                                          True), repeats=2)
        return dict(shape="cpu 2 threads: (1,64,64,64), 64 rois, 7x7, 2 samples", dtype="float32",
                    ours_forward_ms=ours, ours_backward_ms=ours_bwd, reference_forward_ms=ref,
                    speedup_forward_vs_reference=ref / ours)
    finally:
        torch.set_num_threads(threads)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    peer = mmcv_peer()
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rows.append(bench_shape("train: (2,256,256,256), 1024 rois", 2, 512, dtype, peer))
        rows.append(bench_shape("test: (1,256,256,256), 2000 rois", 1, 2000, dtype, peer,
                                with_backward=False))
    rows.append(bench_multilevel(torch.float32))
    rows.append(bench_cpu())
    write_json(args.out, dict(op="riroi_align_rotated", environment=environment(),
                              mmcv_available=peer is not None,
                              command="python benchmarks/bench_riroi_align_rotated.py --out " + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
