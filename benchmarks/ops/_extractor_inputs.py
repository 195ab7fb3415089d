"""What the RoI-extractor benchmarks share: the cases, a 1024^2 image's FPN maps and RoIs of
every size, their command line and their speed-ups."""
import argparse
import math

import torch

IMAGE, CHANNELS = 1024, 256
CASES = (("train", 2, 1024), ("test", 1, 2000))  # (name, images, RoIs)
DTYPES = (torch.float32, torch.float16)


def maps_and_boxes(num_images, num_rois, strides, seed=0, device="cuda"):
    """(maps, boxes, generator): random (N, CHANNELS, IMAGE / s, IMAGE / s) maps for each stride s,
    and RoIs whose sides sqrt(w * h) are log-uniform in [16, 1024] px (every level gets some),
    aspect in [0.5, 2], centres uniform in the image: boxes = (image index (K,), centre (K, 2),
    w (K,), h (K,)). The generator goes on for the caller's own draws."""
    g = torch.Generator(device=device).manual_seed(seed)
    maps = [torch.randn(num_images, CHANNELS, IMAGE // s, IMAGE // s, device=device, generator=g)
            for s in strides]
    size = torch.exp(torch.empty(num_rois, device=device).uniform_(
        math.log(16), math.log(1024), generator=g))
    aspect = torch.empty(num_rois, device=device).uniform_(0.5, 2.0, generator=g).sqrt()
    centre = torch.rand(num_rois, 2, device=device, generator=g) * IMAGE
    index = (torch.arange(num_rois, device=device) % num_images).float()
    return maps, (index, centre, size * aspect, size / aspect), g


def add_speedups(row, ours, peers):
    """row[speedup_<pass>_<ours>_vs_<peer>] for each pass both were timed in."""
    for peer in peers:
        for what in ("forward", "forward_backward"):
            if f"{peer}_{what}_ms" in row and f"{ours}_{what}_ms" in row:
                row[f"speedup_{what}_{ours}_vs_{peer}"] = (row[f"{peer}_{what}_ms"]
                                                           / row[f"{ours}_{what}_ms"])


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=60)
    return parser.parse_args()
