"""Runs each compiled op on the CPU on a small example and prints what it computed."""
import torch

import redet_plugin
from redet_plugin import ops


def main():
    torch.manual_seed(0)
    print(f"redet_plugin {redet_plugin.__version__}, torch {torch.__version__}")
    features = torch.randn(2, 16, 32, 32, requires_grad=True)
    if hasattr(ops, "roi_pool"):
        rois = torch.tensor([[0, 8.0, 8.0, 40.0, 56.0], [1, 0.0, 0.0, 63.0, 63.0]])
        out = ops.roi_pool(features, rois, output_size=7, spatial_scale=0.5)
        out.sum().backward()
        print(f"roi_pool: 2 RoIs -> {tuple(out.shape)}, max {out.max():.3f}, "
              f"grad reaches {int((features.grad != 0).sum())} input pixels")
    if hasattr(ops, "riroi_align_rotated"):
        rois = torch.tensor([[0, 32.0, 32.0, 24.0, 12.0, 0.5], [1, 20.0, 40.0, 30.0, 10.0, -1.2]])
        out = ops.riroi_align_rotated(features, rois, output_size=7, spatial_scale=0.5,
                                      num_samples=2, num_orientations=8, clockwise=True)
        print(f"riroi_align_rotated: 2 rotated RoIs -> {tuple(out.shape)}, mean {out.mean():.4f}")
    if hasattr(ops, "depth_flow_projection"):
        flow = torch.randn(1, 2, 24, 32) * 2
        depth = torch.rand(1, 1, 24, 32) + 0.5
        out = ops.depth_flow_projection(flow, depth, t=0.5, fill_holes=True)
        print(f"depth_flow_projection: flow {tuple(flow.shape)} -> {tuple(out.shape)}, "
              f"mean |F_t->0| {out.abs().mean():.4f}")


if __name__ == "__main__":
    main()
