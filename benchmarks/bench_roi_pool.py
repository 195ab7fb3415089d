"""RoIPool on one GPU: ours vs torchvision (and mmcv) in the same run, shape from ANCHORS.md:
features (2, 256, 200, 200), 1024 RoIs on an 800x800 image, spatial_scale 0.25, 7x7.
Usage: python benchmarks/bench_roi_pool.py --out benchmarks/results/roi_pool_h200.json"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import environment, time_cuda, write_json  # noqa: E402

import redet_plugin  # noqa: E402,F401


def make_inputs(dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    features = torch.randn(2, 256, 200, 200, device="cuda", generator=g).to(dtype)
    k = 1024
    batch = (torch.arange(k, device="cuda") % 2).float()[:, None]
    centre = torch.rand(k, 2, device="cuda", generator=g) * 800
    size = 16 + torch.rand(k, 2, device="cuda", generator=g) * 240
    rois = torch.cat([batch, centre - size / 2, centre + size / 2], dim=1).to(dtype)
    return features, rois


def bench(dtype, deterministic_too=True):
    x, rois = make_inputs(dtype)
    n, c, h, w = x.shape
    ours = lambda: torch.ops.redet.roi_pool(x, rois, 0.25, 7, 7)  # noqa: E731
    out, argmax = ours()
    grad = torch.randn_like(out)
    ours_bwd = lambda: torch.ops.redet._roi_pool_backward(grad, rois, argmax, n, c, h, w)  # noqa: E731
    row = dict(dtype=str(dtype).replace("torch.", ""), ours_forward_ms=time_cuda(ours),
               ours_backward_ms=time_cuda(ours_bwd))
    for kernel in ("plane", "flat"):  # both forward kernels, whatever the automatic choice
        os.environ["REDET_ROI_POOL_KERNEL"] = kernel
        row[f"ours_forward_{kernel}_kernel_ms"] = time_cuda(ours)
    del os.environ["REDET_ROI_POOL_KERNEL"]
    if deterministic_too:
        torch.use_deterministic_algorithms(True)
        row["ours_backward_deterministic_ms"] = time_cuda(ours_bwd)
        torch.use_deterministic_algorithms(False)
    try:
        import torchvision  # noqa: F401
        tv = lambda: torch.ops.torchvision.roi_pool(x, rois, 0.25, 7, 7)  # noqa: E731
        _, tv_arg = tv()
        tv_bwd = lambda: torch.ops.torchvision._roi_pool_backward(  # noqa: E731
            grad, rois, tv_arg, 0.25, 7, 7, n, c, h, w)
        row.update(torchvision_forward_ms=time_cuda(tv), torchvision_backward_ms=time_cuda(tv_bwd))
        row["speedup_forward_vs_torchvision"] = row["torchvision_forward_ms"] / row["ours_forward_ms"]
        row["speedup_backward_vs_torchvision"] = row["torchvision_backward_ms"] / row["ours_backward_ms"]
        if deterministic_too:
            row["speedup_deterministic_backward_vs_torchvision"] = (
                row["torchvision_backward_ms"] / row["ours_backward_deterministic_ms"])
    except (ImportError, RuntimeError) as error:
        row["torchvision_error"] = str(error)[:200]
    if dtype == torch.float32:
        try:
            from mmcv.ops import RoIPool as MmcvRoIPool
            layer = MmcvRoIPool((7, 7), 0.25)
            row["mmcv_forward_ms"] = time_cuda(lambda: layer(x, rois))
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
