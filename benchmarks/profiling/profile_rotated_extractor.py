"""Where the fused RotatedSingleRoIExtractor spends its time on the GPU: torch.profiler tables of
the fused forward and forward + backward (train and test cases of
benchmarks/ops/bench_rotated_extractor.py), plus the host wall time per call. Diagnostic only;
prints to stdout.

    python -m benchmarks.profiling.profile_rotated_extractor   (repo root)
"""
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._timing import back_to_back_us, require_cuda
from benchmarks.ops.bench_rotated_extractor import CHANNELS, LAYER, STRIDES, make_inputs
from redet_plugin.models.roi_heads.roi_extractors import RotatedSingleRoIExtractor
from redet_plugin.ops import RiRoIAlignRotated


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
        host_ms = back_to_back_us(fn, calls=50, warmup=1) / 1e3
        print(f"== {name}: {host_ms:.3f} ms per call (host clock, back-to-back)")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))


if __name__ == "__main__":
    main()
