"""Small RoIPool runs for compute-sanitizer (memcheck, racecheck): every CUDA kernel, edge cases."""
import torch

import redet_plugin  # noqa: F401


def run():
    cases = [
        (torch.randn(2, 3, 9, 11), torch.tensor([[0, 1., 1, 8, 6], [1, -5, -5, 30, 30], [0, 6, 6, 2, 2]])),
        (torch.randn(1, 2, 1, 1), torch.tensor([[0, 0., 0, 0, 0]])),        # 1x1 map
        (torch.randn(1, 2, 5, 5), torch.zeros(0, 5)),                       # no RoIs
        (torch.randn(1, 2, 5, 5), torch.tensor([[0, 50., 50, 60, 60]])),    # fully off the map
    ]
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        for x, rois in cases:
            x = x.to("cuda", dtype).requires_grad_(True)
            for deterministic in (False, True):
                torch.use_deterministic_algorithms(deterministic)
                out = redet_plugin.ops.roi_pool(x, rois.to("cuda", dtype), (2, 3), 0.5)
                out.backward(torch.ones_like(out))
            torch.use_deterministic_algorithms(False)
    torch.cuda.synchronize()
    print("sanitize_roi_pool: done")


if __name__ == "__main__":
    run()
