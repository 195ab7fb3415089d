"""Where the fused RotatedSingleRoIExtractor spends its time on the GPU: torch.profiler tables of
the fused forward and forward + backward (train and test cases of bench_rotated_extractor.py), plus the
host wall time per call. Diagnostic only; prints to stdout.

    python -m benchmarks.profile_rotated_extractor   (repo root)
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._timing import require_cuda
from benchmarks.bench_rotated_extractor import CHANNELS, LAYER, STRIDES, make_inputs
from redet_plugin.models.roi_extractors import RotatedSingleRoIExtractor
from redet_plugin.ops import RiRoIAlignRotated


def host_ms(fn, repeats=50):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / repeats


def main():
    require_cuda("profile_rotated_extractor")
    for dtype in (torch.float32, torch.float16):
        for case, images, num_rois in (("train", 2, 1024), ("test", 1, 2000)):
            print(f"#### {case}: {images} image(s), {num_rois} RoIs, {dtype}")
            profile_case(images, num_rois, dtype)


def profile_case(images, num_rois, dtype):
    feats, rois = make_inputs(images, num_rois, dtype)
    feats_grad = [f.detach().requires_grad_(True) for f in feats]
    extractor = RotatedSingleRoIExtractor(dict(type=RiRoIAlignRotated, **LAYER), CHANNELS,
                                          STRIDES, fused=True).cuda()
    grad_out = torch.randn_like(extractor(feats, rois))
    cases = dict(forward=lambda: extractor(feats, rois),
                 forward_backward=lambda: torch.autograd.grad(extractor(feats_grad, rois),
                                                              feats_grad, grad_out))
    for name, fn in cases.items():
        print(f"== {name}: {host_ms(fn):.3f} ms per call (host clock, back-to-back)")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))


if __name__ == "__main__":
    main()
