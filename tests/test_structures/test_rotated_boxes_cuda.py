"""RotatedBoxes on CUDA tensors give the CPU results (skipped without CUDA)."""
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures import RotatedBoxes, qbox2rbox, rbox2hbox, rbox2qbox

pytestmark = pytest.mark.cuda


def boxes(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.rand(n, 2, generator=g) * 200, torch.rand(n, 2, generator=g) * 50 + 5,
                      torch.rand(n, 1, generator=g) * 3 - 1.5], dim=1)


def test_overlaps_and_helpers_match_cpu():
    a, b = boxes(0), boxes(1)
    b[:32, :2] = a[:32, :2] + 2
    cpu = RotatedBoxes.overlaps(RotatedBoxes(a), RotatedBoxes(b))
    gpu = RotatedBoxes.overlaps(RotatedBoxes(a.cuda()), RotatedBoxes(b.cuda()))
    assert gpu.is_cuda and torch.allclose(gpu.cpu(), cpu, atol=1e-4)
    assert torch.allclose(rbox2qbox(a.cuda()).cpu(), rbox2qbox(a), atol=1e-4)
    assert torch.allclose(rbox2hbox(a.cuda()).cpu(), rbox2hbox(a), atol=1e-4)
    back = qbox2rbox(rbox2qbox(a.cuda()))
    assert back.is_cuda and torch.allclose(back.cpu(), qbox2rbox(rbox2qbox(a)), atol=1e-3)


def test_in_place_transforms_match_cpu():
    for op, args in (('flip_', ((300, 400), 'diagonal')), ('rotate_', ((100.0, 80.0), 33.0)),
                     ('rescale_', ((0.5, 2.0),)), ('translate_', ((3.0, -4.0),)), ('resize_', ((1.5, 0.5),))):
        cpu, gpu = RotatedBoxes(boxes(2)), RotatedBoxes(boxes(2).cuda())
        getattr(cpu, op)(*args)
        getattr(gpu, op)(*args)
        assert gpu.tensor.is_cuda and torch.allclose(gpu.tensor.cpu(), cpu.tensor, atol=1e-4), op
    points = torch.rand(100, 2) * 200
    cpu = RotatedBoxes(boxes(3)).find_inside_points(points)
    assert torch.equal(RotatedBoxes(boxes(3).cuda()).find_inside_points(points.cuda()).cpu(), cpu)
