"""unchecked_rois(): on CUDA the RoI ops skip their value check inside it (no host wait, bad rows
pool zeros, as inside a CUDA graph) and check again after it; the CPU kernels always check."""
import pytest
import torch

from redet_plugin.ops import riroi_align_rotated, roi_pool, unchecked_rois
from redet_plugin.testing import waits_for_nothing


def bad_inputs(device):
    feats = torch.randn(2, 8, 16, 16, device=device)
    good = [0.0, 2.0, 2.0, 12.0, 12.0]
    rois = torch.tensor([good, [5.0, 2.0, 2.0, 12.0, 12.0], good], device=device)  # image 5 of 2
    return feats, rois


def test_cpu_checks_inside_unchecked_rois_too():
    feats, rois = bad_inputs('cpu')
    with unchecked_rois(), pytest.raises(RuntimeError, match='roi_pool'):
        roi_pool(feats, rois, 7, 1.0)


@pytest.mark.cuda
def test_cuda_skips_the_check_inside_and_checks_after():
    feats, rois = bad_inputs('cuda')
    expected = roi_pool(feats, rois[[0]], 7, 1.0)
    roi_pool(feats, rois[[0]], 7, 1.0)  # warm-up: the check's first allocations
    with waits_for_nothing():
        with unchecked_rois():
            out = roi_pool(feats, rois, 7, 1.0)
            rotated = torch.cat([rois[:, :1], rois[:, 1:3] + 5, rois[:, 3:] - rois[:, 1:3],
                                 torch.zeros_like(rois[:, :1])], 1)
            riroi = riroi_align_rotated(feats, rotated, 7, 1.0, 2, 8, True)
    assert torch.equal(out[0], expected[0]) and torch.equal(out[2], expected[0])
    assert (out[1] == 0).all() and (riroi[1] == 0).all()
    with pytest.raises(RuntimeError, match='roi_pool'):
        roi_pool(feats, rois, 7, 1.0)
