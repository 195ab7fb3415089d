"""Small runs of RotatedSingleRoIExtractor's fused path (the multi-level RiRoIAlignRotated kernels:
forward, backward, deterministic backward) for compute-sanitizer, with the edge cases an FPN
produces: no RoIs, levels without RoIs, RoIs off the map, 1x1 maps at the coarsest levels.
Usage (repo root):
    compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_rotated_extractor"""
import torch

import redet_plugin.mm  # noqa: F401  (registers RedetRiRoIAlignRotated)
from redet_plugin.models.roi_heads.roi_extractors import RotatedSingleRoIExtractor

LAYER = dict(type="RedetRiRoIAlignRotated", output_size=3, num_samples=2, num_orientations=4,
             clockwise=True)
STRIDES = [4, 8, 16, 32, 64]


def run():
    extractor = RotatedSingleRoIExtractor(LAYER, 8, STRIDES, fused=True).cuda()
    roi_sets = [
        torch.zeros(0, 6),                                                   # no RoIs
        torch.tensor([[0, 20.0, 20.0, 30.0, 20.0, 0.4]]),                    # level 0 only
        torch.tensor([[1, 30.0, 30.0, 300.0, 200.0, -2.0], [0, 60.0, 10.0, 1000.0, 900.0, 3.1],
                      [1, -500.0, 900.0, 50.0, 50.0, 1.0],                   # off the map
                      [0, 63.0, 63.0, 1.0, 0.5, 0.0]]),                      # tiny
    ]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        feats = [torch.randn(2, 8, max(64 // s, 1), max(64 // s, 1), device="cuda", dtype=dtype)
                 .requires_grad_(True) for s in STRIDES]                     # 16x16 ... 1x1
        for rois in roi_sets:
            for deterministic in (False, True):
                torch.use_deterministic_algorithms(deterministic)
                out = extractor(feats, rois.to("cuda", dtype))
                torch.autograd.grad(out, feats, torch.ones_like(out))
            torch.use_deterministic_algorithms(False)
    torch.cuda.synchronize()
    print("sanitize_rotated_extractor: done")


if __name__ == "__main__":
    run()
