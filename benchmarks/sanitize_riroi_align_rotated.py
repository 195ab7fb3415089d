"""Small RiRoIAlignRotated runs for compute-sanitizer (memcheck, racecheck): every CUDA kernel
(forward for nO = 8, 4 and any other nO; fast and deterministic backward; multi-level), edge cases."""
import math

import torch

import redet_plugin  # noqa: F401
from redet_plugin.ops import riroi_align_rotated, riroi_align_rotated_multilevel


def run():
    cases = [
        (torch.randn(2, 16, 9, 11), torch.tensor([[0, 4., 4, 6, 3, 0.3], [1, -5, -5, 30, 30, -2.0],
                                                  [0, 8, 6, 2, 2, math.pi / 4]])),
        (torch.randn(1, 8, 1, 1), torch.tensor([[0, 0., 0, 1, 1, 1.0]])),          # 1x1 map
        (torch.randn(1, 8, 5, 5), torch.zeros(0, 6)),                               # no RoIs
        (torch.randn(1, 8, 5, 5), torch.tensor([[0, 50., 50, 6, 6, 0.5]])),         # off the map
        (torch.randn(1, 8, 5, 5), torch.tensor([[0, 2., 2, 40, 40, -7.0]])),        # covers it all
    ]
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for x, rois in cases:
            for nO in (8, 4, 2):
                xi = x.to("cuda", dtype).requires_grad_(True)
                for deterministic in (False, True):
                    torch.use_deterministic_algorithms(deterministic)
                    out = riroi_align_rotated(xi, rois.to("cuda", dtype), (2, 3), 0.5, 0, nO, True)
                    out.backward(torch.ones_like(out))
                torch.use_deterministic_algorithms(False)
        features = [torch.randn(2, 16, s, s, device="cuda", dtype=dtype, requires_grad=True)
                    for s in (12, 6, 3, 1)]
        rois = torch.tensor([[0, 10., 10, 8, 4, 0.2], [1, 20, 5, 16, 16, 1.0],
                             [1, -3, 40, 40, 8, -1.0]], device="cuda", dtype=dtype)
        levels = torch.tensor([0, 1, 3], device="cuda")  # level 2 has no RoI
        for deterministic in (False, True):
            torch.use_deterministic_algorithms(deterministic)
            out = riroi_align_rotated_multilevel(features, rois, levels, [0.5, 0.25, 0.125, 0.0625],
                                                 (3, 3), 2, 8)
            out.backward(torch.ones_like(out))
        torch.use_deterministic_algorithms(False)
    torch.cuda.synchronize()
    print("sanitize_riroi_align_rotated: done")


if __name__ == "__main__":
    run()
