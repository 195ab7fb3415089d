"""RiRoIAlignRotated on one GPU, timed as users call it: our module (redet_plugin.ops.RiRoIAlignRotated)
against mmcv's module (mmcv.ops.RiRoIAlignRotated) in the same run on the same inputs. Shapes from
ANCHORS.md:
  train: features (2, 256, 256, 256) = 32 fields x 8 orientations, NCHW, requires_grad=True,
         1024 RoIs (512 per image, centres uniform in 1024^2, w, h in [16, 256] px,
         theta in [-pi, pi)), scale 0.25, 7x7, 2 samples per bin side, clockwise;
         forward, and backward through autograd (torch.autograd.grad);
  test:  1 image, 2000 RoIs, same map, forward under torch.no_grad() (as a detector's test step).
Our forward reads channels-last features: with NCHW input it includes the transpose
(`ours_forward_ms`); `ours_forward_channels_last_ms` takes channels-last input (no copy).
Diagnostics: our raw torch.ops.redet calls (no Python face, no autograd), the deterministic
backward, legacy_orientation=True against mmcv's output (the same function), the host's time per
call of calls back to back (no flush), and our CPU kernel (2 threads, small shape; mmcv has none).
fp32 first; fp16 and bf16 too (mmcv has no bf16 kernel: there ours is compared with our fp32).
Usage (repo root): python -m benchmarks.ops.bench_riroi_align_rotated --out riroi_align_rotated_h200.json"""
import argparse
import math

import torch

from benchmarks._timing import (autograd_backward, back_to_back_us, deterministic, dtype_name,
                                environment, median_wall_ms, require_cuda, speedup, time_cuda,
                                time_forward_backward, write_json)
from redet_plugin.ops import RiRoIAlignRotated

SCALE, OUT, SAMPLES, NO = 0.25, 7, 2, 8
LAYER = dict(spatial_scale=SCALE, num_samples=SAMPLES, num_orientations=NO, clockwise=True)
GOALS = dict(train_forward_vs_mmcv=2.5, train_backward_vs_mmcv=5.0, test_forward_vs_mmcv=3.5)


def make_rois(num_images, per_image, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    k = num_images * per_image
    batch = (torch.arange(k, device=device) // per_image).double()[:, None]
    centre = torch.rand(k, 2, device=device, generator=g, dtype=torch.float64) * 1024
    size = 16 + torch.rand(k, 2, device=device, generator=g, dtype=torch.float64) * 240
    theta = (torch.rand(k, 1, device=device, generator=g, dtype=torch.float64) * 2 - 1) * math.pi
    return torch.cat([batch, centre, size, theta], dim=1)


def make_features(num_images, dtype, device="cuda", seed=1):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(num_images, 32 * NO, 256, 256, device=device, generator=g).to(dtype)


def layers():
    """Our module and mmcv's (None, with the reason, when mmcv has no CUDA ops here)."""
    ours = RiRoIAlignRotated(OUT, **LAYER)
    try:
        from mmcv.ops import RiRoIAlignRotated as MmcvRiRoIAlignRotated
        return ours, MmcvRiRoIAlignRotated(OUT, **LAYER), None
    except ImportError as error:
        return ours, None, str(error)[:200]


def bench_train(dtype, ours, peer):
    x, rois = make_features(2, dtype), make_rois(2, 512).to(dtype)
    row = dict(shape="train: (2,256,256,256), 1024 rois", dtype=dtype_name(dtype))
    out, ours_backward = time_forward_backward(row, "ours", ours, x, rois)
    row["ours_backward_deterministic_ms"] = time_cuda(deterministic(ours_backward))
    x_cl = x.contiguous(memory_format=torch.channels_last).requires_grad_(True)
    row["ours_forward_channels_last_ms"] = time_cuda(lambda: ours(x_cl, rois))
    row["transpose_ms"] = time_cuda(lambda: x.contiguous(memory_format=torch.channels_last))
    row["channels_last_equals_nchw"] = bool(torch.equal(out, ours(x_cl, rois).detach()))
    del x_cl

    # diagnostic: the raw ops, without the Python face and autograd
    args = (SCALE, OUT, OUT, SAMPLES, NO, True, False)
    grad = torch.randn_like(out)
    row["raw_forward_ms"] = time_cuda(lambda: torch.ops.redet.riroi_align_rotated(x, rois, *args))
    row["raw_backward_ms"] = time_cuda(lambda: torch.ops.redet._riroi_align_rotated_backward(
        grad, rois, SCALE, SAMPLES, NO, True, False, *x.shape))

    if peer is not None:
        try:
            peer_out, _ = time_forward_backward(row, "mmcv", peer, x, rois)
            legacy = RiRoIAlignRotated(OUT, legacy_orientation=True, **LAYER)(x, rois)
            row["legacy_vs_mmcv_max_rel_diff"] = ((legacy.float() - peer_out.float()).abs().max()
                                                  / peer_out.float().abs().max()).item()
        except Exception as error:  # noqa: BLE001  (no kernel for this dtype: report, carry on)
            row["mmcv_error"] = str(error)[:200]
    speedup(row, "mmcv_forward_ms", "ours_forward_ms", "speedup_forward_vs_mmcv")
    speedup(row, "mmcv_forward_ms", "ours_forward_channels_last_ms",
            "speedup_forward_channels_last_vs_mmcv")
    speedup(row, "mmcv_backward_ms", "ours_backward_ms", "speedup_backward_vs_mmcv")
    speedup(row, "mmcv_backward_ms", "ours_backward_deterministic_ms",
            "speedup_deterministic_backward_vs_mmcv")
    return row


def bench_test(dtype, ours, peer):
    x, rois = make_features(1, dtype), make_rois(1, 2000).to(dtype)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    row = dict(shape="test: (1,256,256,256), 2000 rois, no_grad", dtype=dtype_name(dtype))
    with torch.no_grad():
        row["ours_forward_ms"] = time_cuda(lambda: ours(x, rois))
        row["ours_forward_channels_last_ms"] = time_cuda(lambda: ours(x_cl, rois))
        row["ours_forward_host_us"] = back_to_back_us(lambda: ours(x, rois))
        if peer is not None:
            try:
                row["mmcv_forward_ms"] = time_cuda(lambda: peer(x, rois))
                row["mmcv_forward_host_us"] = back_to_back_us(lambda: peer(x, rois))
            except Exception as error:  # noqa: BLE001
                row["mmcv_error"] = str(error)[:200]
    speedup(row, "mmcv_forward_ms", "ours_forward_ms", "speedup_forward_vs_mmcv")
    speedup(row, "mmcv_forward_ms", "ours_forward_channels_last_ms",
            "speedup_forward_channels_last_vs_mmcv")
    return row


def bench_cpu(ours):
    """Our CPU kernel, 2 threads, small shape (no peer has a CPU kernel): public forward and
    autograd backward, median wall time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = make_features(1, torch.float32, device="cpu")[:, :8 * NO, :64, :64].contiguous()
        x.requires_grad_(True)
        rois = make_rois(1, 64, device="cpu")
        rois[:, 1:3] /= 4  # centres on the 256^2 image of a 64^2 map
        rois = rois.float()
        out = ours(x, rois)
        return dict(shape="cpu 2 threads: (1,64,64,64), 64 rois, 7x7, 2 samples", dtype="float32",
                    ours_forward_ms=median_wall_ms(lambda: ours(x, rois), repeats=5),
                    ours_backward_ms=median_wall_ms(
                        autograd_backward(out, x, torch.randn_like(out)), repeats=5))
    finally:
        torch.set_num_threads(threads)


def goals(rows):
    def find(shape, dtype):
        return next(r for r in rows if r["shape"].startswith(shape) and r["dtype"] == dtype)
    met = {}
    for name, target in GOALS.items():  # e.g. "train_forward_vs_mmcv": 2.5
        shape, what = name.split("_")[:2]
        met[f"{name}_{target}x"] = find(shape, "float32").get(f"speedup_{what}_vs_mmcv", 0.0) >= target
    for dtype in ("float16", "bfloat16"):
        for shape, measured in (("train", ("forward", "backward")), ("test", ("forward",))):
            for what in measured:
                met[f"{shape}_{dtype}_{what}_not_slower_than_fp32"] = (
                    find(shape, dtype)[f"ours_{what}_ms"] <= find(shape, "float32")[f"ours_{what}_ms"])
    return met


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    require_cuda("bench_riroi_align_rotated")
    ours, peer, peer_missing = layers()
    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rows.append(bench_train(dtype, ours, peer))
        rows.append(bench_test(dtype, ours, peer))
    rows.append(bench_cpu(ours))
    write_json(args.out, dict(op="riroi_align_rotated", environment=environment(),
                              layer=dict(output_size=OUT, **LAYER), goals=GOALS,
                              goals_met=goals(rows), mmcv_missing=peer_missing,
                              command="python -m benchmarks.ops.bench_riroi_align_rotated --out "
                              + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
