"""RoIPool on one GPU: ours vs torchvision (and mmcv) in the same run, shape from ANCHORS.md:
features (2, 256, 200, 200), 1024 RoIs on an 800x800 image, spatial_scale 0.25, 7x7.
Our CUDA forward gathers from channels-last memory: `ours_forward_ms` takes the usual NCHW input
and includes the transpose (also timed alone); `ours_forward_channels_last_ms` takes a
channels-last input (no copy). Both take the forward's vector path (2 channels a lane, C = 256 is
even); `ours_forward_scalar_path_ms` runs the scalar path (a lane per channel) on the same values,
through a channels-last view at an odd storage offset (misaligned pairs). The peers take NCHW input.
Usage: python benchmarks/bench_roi_pool.py --out benchmarks/results/roi_pool_h200.json"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import environment, peak_extra_memory_mb, time_cuda, write_json  # noqa: E402

import redet_plugin  # noqa: E402,F401

SCALE, SIZE = 0.25, 7


def make_inputs(dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    features = torch.randn(2, 256, 200, 200, device="cuda", generator=g).to(dtype)
    k = 1024
    batch = (torch.arange(k, device="cuda") % 2).float()[:, None]
    centre = torch.rand(k, 2, device="cuda", generator=g) * 800
    size = 16 + torch.rand(k, 2, device="cuda", generator=g) * 240
    rois = torch.cat([batch, centre - size / 2, centre + size / 2], dim=1).to(dtype)
    return features, rois


def channels_last_at_offset(x, offset):
    """x's values in channels-last memory `offset` elements into its storage (odd: the forward's
    scalar path)."""
    n, c, h, w = x.shape
    storage = torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)
    view = storage[offset:].view(n, h, w, c).permute(0, 3, 1, 2)
    view.copy_(x)
    return view


def measure(row, name, fn):
    """Median time and peak extra memory of fn under `name`."""
    row[f"{name}_ms"] = time_cuda(fn)
    row[f"{name}_peak_extra_mb"] = peak_extra_memory_mb(fn)


def bench(dtype, deterministic_too=True):
    x, rois = make_inputs(dtype)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    n, c, h, w = x.shape
    row = dict(dtype=str(dtype).replace("torch.", ""))
    measure(row, "ours_forward", lambda: torch.ops.redet.roi_pool(x, rois, SCALE, SIZE, SIZE))
    measure(row, "ours_forward_channels_last",
            lambda: torch.ops.redet.roi_pool(x_cl, rois, SCALE, SIZE, SIZE))
    row["channels_last_transpose_ms"] = time_cuda(lambda: x.contiguous(memory_format=torch.channels_last))
    out, argmax = torch.ops.redet.roi_pool(x, rois, SCALE, SIZE, SIZE)
    out_cl, argmax_cl = torch.ops.redet.roi_pool(x_cl, rois, SCALE, SIZE, SIZE)
    row["channels_last_identical_to_nchw"] = bool(torch.equal(out, out_cl) and torch.equal(argmax, argmax_cl))
    x_scalar = channels_last_at_offset(x, 1)
    measure(row, "ours_forward_scalar_path",
            lambda: torch.ops.redet.roi_pool(x_scalar, rois, SCALE, SIZE, SIZE))
    out_s, argmax_s = torch.ops.redet.roi_pool(x_scalar, rois, SCALE, SIZE, SIZE)
    row["scalar_path_identical"] = bool(torch.equal(out, out_s) and torch.equal(argmax, argmax_s))
    row["speedup_vector_vs_scalar_path"] = (
        row["ours_forward_scalar_path_ms"] / row["ours_forward_channels_last_ms"])
    del x_scalar
    grad = torch.randn_like(out)
    ours_bwd = lambda: torch.ops.redet._roi_pool_backward(grad, rois, argmax, n, c, h, w)  # noqa: E731
    row["ours_backward_ms"] = time_cuda(ours_bwd)
    if deterministic_too:
        torch.use_deterministic_algorithms(True)
        row["ours_backward_deterministic_ms"] = time_cuda(ours_bwd)
        torch.use_deterministic_algorithms(False)
    try:
        import torchvision  # noqa: F401
        tv = lambda: torch.ops.torchvision.roi_pool(x, rois, SCALE, SIZE, SIZE)  # noqa: E731
        tv_out, tv_arg = tv()
        row["identical_to_torchvision"] = bool(torch.equal(out, tv_out) and torch.equal(argmax, tv_arg))
        tv_bwd = lambda: torch.ops.torchvision._roi_pool_backward(  # noqa: E731
            grad, rois, tv_arg, SCALE, SIZE, SIZE, n, c, h, w)
        measure(row, "torchvision_forward", tv)
        row["torchvision_backward_ms"] = time_cuda(tv_bwd)
        tv_ms = row["torchvision_forward_ms"]
        row["speedup_forward_vs_torchvision"] = tv_ms / row["ours_forward_ms"]
        row["speedup_forward_channels_last_vs_torchvision"] = tv_ms / row["ours_forward_channels_last_ms"]
        row["speedup_backward_vs_torchvision"] = row["torchvision_backward_ms"] / row["ours_backward_ms"]
        if deterministic_too:
            row["speedup_deterministic_backward_vs_torchvision"] = (
                row["torchvision_backward_ms"] / row["ours_backward_deterministic_ms"])
    except (ImportError, RuntimeError) as error:
        row["torchvision_error"] = str(error)[:200]
    if dtype == torch.float32:
        try:
            from mmcv.ops import RoIPool as MmcvRoIPool
            layer = MmcvRoIPool((SIZE, SIZE), SCALE)
            measure(row, "mmcv_forward", lambda: layer(x, rois))
            row["speedup_forward_vs_mmcv"] = row["mmcv_forward_ms"] / row["ours_forward_ms"]
            row["speedup_forward_channels_last_vs_mmcv"] = (
                row["mmcv_forward_ms"] / row["ours_forward_channels_last_ms"])
        except Exception as error:  # noqa: BLE001  (report, do not fail the benchmark)
            row["mmcv_error"] = str(error)[:200]
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [bench(torch.float32), bench(torch.float16), bench(torch.bfloat16)]
    write_json(args.out, dict(op="roi_pool", environment=environment(),
                              shape="features (2,256,200,200), 1024 rois on 800^2, scale 0.25, 7x7",
                              command="python benchmarks/bench_roi_pool.py --out " + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
