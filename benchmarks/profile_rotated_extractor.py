"""Where the fused RotatedSingleRoIExtractor spends its time on the GPU: torch.profiler tables of
the fused forward and forward + backward (train case of bench_rotated_extractor.py), plus the
host wall time per call. Diagnostic only; prints to stdout.

    python benchmarks/profile_rotated_extractor.py
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench_rotated_extractor import CHANNELS, LAYER, STRIDES, make_inputs
from redet_plugin.models.roi_extractors import RotatedSingleRoIExtractor


def host_ms(fn, repeats=50):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / repeats


def main():
    feats, rois = make_inputs(2, 1024, torch.float32)
    feats_grad = [f.detach().requires_grad_(True) for f in feats]
    extractor = RotatedSingleRoIExtractor(dict(type="RiRoIAlignRotated", **LAYER), CHANNELS,
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
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))


if __name__ == "__main__":
    main()
