"""RoIPool on one GPU, timed as users call it: ours (redet_plugin.ops.roi_pool / RoIPool) against
torchvision.ops.roi_pool and mmcv.ops.roi_pool in the same run on the same inputs. Shape from
ANCHORS.md: features (2, 256, 200, 200), 1024 RoIs on an 800x800 image, spatial_scale 0.25, 7x7.

Each op's forward takes NCHW features with requires_grad=True (as in training); its backward runs
through autograd (torch.autograd.grad). Our CUDA forward gathers from channels-last memory, so
`ours_forward_ms` includes the transpose; `ours_forward_channels_last_ms` takes channels-last
features (no copy). Diagnostics: our raw torch.ops.redet calls (no Python face, no autograd), the
scalar path (a lane per channel, through a channels-last view at an odd storage offset), the
deterministic backward, and the host's time per call of calls back to back (no flush).
fp32 first; fp16 and bf16 too (torchvision has no bf16 kernel: there ours is compared with our fp32).
Usage (repo root): python -m benchmarks.ops.bench_roi_pool --out roi_pool_h200.json"""
import argparse

import torch

from benchmarks._timing import (deterministic, dtype_name, environment, require_cuda, speedup,
                                time_cuda, time_forward_backward, write_json)
from redet_plugin.ops import roi_pool
from redet_plugin.testing import channels_last_at_offset

SCALE, SIZE = 0.25, 7
SHAPE = "features (2,256,200,200), 1024 rois on 800^2, scale 0.25, 7x7"
GOALS = dict(forward_vs_torchvision=1.5, backward_vs_torchvision=1.5)


def make_inputs(dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    features = torch.randn(2, 256, 200, 200, device="cuda", generator=g).to(dtype)
    k = 1024
    batch = (torch.arange(k, device="cuda") % 2).float()[:, None]
    centre = torch.rand(k, 2, device="cuda", generator=g) * 800
    size = 16 + torch.rand(k, 2, device="cuda", generator=g) * 240
    rois = torch.cat([batch, centre - size / 2, centre + size / 2], dim=1).to(dtype)
    return features, rois


def peers():
    """The peers' public functions that this machine has, and why the others are missing."""
    found, missing = {}, {}
    try:
        import torchvision.ops
        found["torchvision"] = lambda x, rois: torchvision.ops.roi_pool(x, rois, SIZE, SCALE)
    except ImportError as error:
        missing["torchvision"] = str(error)[:200]
    try:
        import mmcv.ops
        found["mmcv"] = lambda x, rois: mmcv.ops.roi_pool(x, rois, (SIZE, SIZE), SCALE)
    except ImportError as error:
        missing["mmcv"] = str(error)[:200]
    return found, missing


def bench(dtype, peer_fns):
    x, rois = make_inputs(dtype)
    n, c, h, w = x.shape
    row = dict(dtype=dtype_name(dtype))
    ours = lambda features, boxes: roi_pool(features, boxes, SIZE, SCALE)  # noqa: E731
    out, ours_backward = time_forward_backward(row, "ours", ours, x, rois)
    row["ours_backward_deterministic_ms"] = time_cuda(deterministic(ours_backward))
    x_cl = x.contiguous(memory_format=torch.channels_last)
    row["ours_forward_channels_last_ms"] = time_cuda(lambda: ours(x_cl, rois))
    row["channels_last_transpose_ms"] = time_cuda(lambda: x.contiguous(memory_format=torch.channels_last))
    row["channels_last_identical_to_nchw"] = bool(torch.equal(out, ours(x_cl, rois)))
    x_scalar = channels_last_at_offset(x, 1)
    row["ours_forward_scalar_path_ms"] = time_cuda(lambda: ours(x_scalar, rois))
    row["scalar_path_identical"] = bool(torch.equal(out, ours(x_scalar, rois)))
    del x_scalar, x_cl

    # diagnostic: the raw ops, without the Python face and autograd
    raw_out, argmax = torch.ops.redet.roi_pool(x, rois, SCALE, SIZE, SIZE)
    grad = torch.randn_like(raw_out)
    row["raw_forward_ms"] = time_cuda(lambda: torch.ops.redet.roi_pool(x, rois, SCALE, SIZE, SIZE))
    row["raw_backward_ms"] = time_cuda(
        lambda: torch.ops.redet._roi_pool_backward(grad, rois, argmax, n, c, h, w))

    for peer, pool in peer_fns.items():
        try:
            peer_out, _ = time_forward_backward(row, peer, pool, x, rois)
            row[f"identical_to_{peer}"] = bool(torch.equal(out, peer_out))
        except Exception as error:  # noqa: BLE001  (no kernel for this dtype: report, carry on)
            row[f"{peer}_error"] = str(error)[:200]
            continue
        for what in ("forward", "backward"):
            speedup(row, f"{peer}_{what}_ms", f"ours_{what}_ms", f"speedup_{what}_vs_{peer}")
        speedup(row, f"{peer}_forward_ms", "ours_forward_channels_last_ms",
                f"speedup_forward_channels_last_vs_{peer}")
        speedup(row, f"{peer}_backward_ms", "ours_backward_deterministic_ms",
                f"speedup_deterministic_backward_vs_{peer}")
    return row


def goals(rows):
    fp32 = next(r for r in rows if r["dtype"] == "float32")
    met = {f"{what}_{target}x": fp32.get(f"speedup_{what}", 0.0) >= target
           for what, target in GOALS.items()}
    for r in rows:
        if r["dtype"] != "float32":
            for what in ("forward", "backward"):
                met[f"{r['dtype']}_{what}_not_slower_than_fp32"] = (
                    r[f"ours_{what}_ms"] <= fp32[f"ours_{what}_ms"])
    return met


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    require_cuda("bench_roi_pool")
    peer_fns, missing = peers()
    rows = [bench(dtype, peer_fns) for dtype in (torch.float32, torch.float16, torch.bfloat16)]
    write_json(args.out, dict(op="roi_pool", environment=environment(), shape=SHAPE,
                              goals=GOALS, goals_met=goals(rows), peers_missing=missing,
                              command="python -m benchmarks.ops.bench_roi_pool --out " + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
