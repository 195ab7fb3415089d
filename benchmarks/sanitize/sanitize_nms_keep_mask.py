"""Small nms_keep_mask runs for compute-sanitizer (memcheck, racecheck): the suppression-mask
kernel and the greedy scan on the device (csrc/nms_keep_mask/cuda/nms_keep_mask_forward.cu) on
edge cases: no boxes, one box, a count that fills its 64-box words exactly and one that leaves a
partial word, several blocks of words (more than the mask kernel's column lanes), label groups of
one box and of several tiles, rotated and horizontal boxes, with and without labels, every
dtype, and boxes with NaN, inf or zero size (IoU 0 with every box).
Usage (repo root):
    compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_nms_keep_mask"""

import torch

from redet_plugin.ops import nms_keep_mask


def boxes(n, columns, generator):
    centres = torch.rand(n, 2, generator=generator) * 200
    sizes = 4 + torch.rand(n, 2, generator=generator) * 40
    if columns == 4:
        return torch.cat([centres - sizes / 2, centres + sizes / 2], dim=1)
    angles = (torch.rand(n, 1, generator=generator) - 0.5) * 3.1416
    return torch.cat([centres, sizes, angles], dim=1)


def run():
    generator = torch.Generator().manual_seed(0)
    for columns in (5, 4):
        for n in (0, 1, 63, 64, 65, 200, 3000):
            b = boxes(n, columns, generator)
            if n >= 3:  # degenerate boxes: NaN, inf, zero size
                b[0, 0] = float("nan")
                b[1, 2] = float("inf")
                b[2, 2:4] = 0
            scores = torch.rand(n, generator=generator)
            # four groups among boxes with labels of their own (the multiclass NMS's pairs
            # below score_thr): the scan's groups of one and its multi-tile groups
            labels = torch.where(torch.rand(n, generator=generator) < 0.5,
                                 torch.randint(0, 4, (n,), generator=generator), torch.arange(n) + 4)
            for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
                for with_labels in (False, True):
                    try:
                        nms_keep_mask(b.to("cuda", dtype), scores.to("cuda", dtype), 0.3,
                                      labels.cuda() if with_labels else None)
                    except RuntimeError as error:  # a dtype the op does not take
                        if "dtype" not in str(error):
                            raise
    torch.cuda.synchronize()
    print("sanitize_nms_keep_mask: done")


if __name__ == "__main__":
    run()
