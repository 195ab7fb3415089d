"""GraphedForward: a forward captured once and replayed for each input, or left eager with one
warning when it cannot be captured."""
import warnings

import pytest
import torch

from redet_plugin.deploy.graphed_forward import GraphedForward

pytestmark = pytest.mark.cuda
DEVICE = torch.device('cuda', 0)


def image(seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (6, 5, 3), generator=generator, dtype=torch.uint8).to(DEVICE)


def test_replay_gives_each_inputs_outputs():
    graphed = GraphedForward(lambda pixels: (pixels.float().cumsum(0), pixels.sum()), DEVICE)
    for seed in range(3):
        pixels = image(seed)
        summed, total = graphed(pixels)
        assert graphed.captured
        torch.testing.assert_close(summed, pixels.float().cumsum(0), rtol=0, atol=0)
        assert int(total) == int(pixels.sum())


def test_forward_that_reads_back_stays_eager_with_one_warning():
    """The failed capture also leaves the process's random numbers on the GPU working (torch
    leaves its generator marked as capturing)."""
    def reads_back(pixels):
        scale = 2.0 if pixels.float().mean().item() >= 0 else 3.0  # a host read: not capturable
        return (pixels.float() * scale,)
    graphed = GraphedForward(reads_back, DEVICE)
    with pytest.warns(UserWarning, match=r'^the package runs without a CUDA graph: its capture '
                                         r'failed \(.*\)$'):
        (first,) = graphed(image(0))
    assert not graphed.captured
    torch.testing.assert_close(first, image(0).float() * 2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        (second,) = graphed(image(1))
    torch.testing.assert_close(second, image(1).float() * 2)
    assert torch.randn(4, device=DEVICE).isfinite().all()
