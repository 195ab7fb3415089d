"""RedetOptimWrapper clips as mmengine's OptimWrapper does (same parameters after the steps) and
records the gradient norm with defer_scalar: unread until the hub's queue is flushed."""
import copy
import uuid

import pytest
import torch
from mmdet.registry import OPTIM_WRAPPERS
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper as MMEngineOptimWrapper
from mmengine.registry import OPTIM_WRAPPERS as ROOT_OPTIM_WRAPPERS
from torch import nn

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.engine import OptimWrapper
from redet_plugin.utils.deferred_scalars import attach_queue, detach_queue


def _steps(wrapper_type, model, clip_grad, steps=4):
    hub = MessageHub.get_instance(f'optim-test-{uuid.uuid4().hex}')  # (the wrapper's hub)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    wrapper = wrapper_type(optimizer, clip_grad=dict(clip_grad))  # (it pops 'type')
    queue = attach_queue(hub)
    waiting = []
    for step in range(steps):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        wrapper.update_params((model(x) ** 2).sum() * 10)  # (large: the clipping binds)
        waiting.append(len(queue))
    detach_queue(hub)  # (flushes)
    return hub, waiting


def test_registered_under_the_one_naming_scheme():
    from mmengine.optim import AmpOptimWrapper as MMEngineAmpOptimWrapper

    from redet_plugin.engine import AmpOptimWrapper
    assert OPTIM_WRAPPERS.get('RedetOptimWrapper') is OptimWrapper
    assert ROOT_OPTIM_WRAPPERS.get('mmdet.RedetOptimWrapper') is OptimWrapper
    assert issubclass(OptimWrapper, MMEngineOptimWrapper)
    assert OPTIM_WRAPPERS.get('RedetAmpOptimWrapper') is AmpOptimWrapper
    assert issubclass(AmpOptimWrapper, MMEngineAmpOptimWrapper)


@pytest.mark.parametrize('clip_grad', [dict(max_norm=0.5, norm_type=2),
                                       dict(type='value', clip_value=0.01)])
def test_same_parameters_as_mmengine_and_the_norm_deferred(clip_grad):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    theirs, ours = copy.deepcopy(model), copy.deepcopy(model)
    their_hub, _ = _steps(MMEngineOptimWrapper, theirs, clip_grad)
    our_hub, waiting = _steps(OptimWrapper, ours, clip_grad)
    for a, b in zip(theirs.parameters(), ours.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(model[0].weight, ours[0].weight)
    if clip_grad.get('type') == 'value':  # (clip_grad_value_ gives no norm: nothing logged)
        assert waiting == [0] * 4 and 'train/grad_norm' not in our_hub.log_scalars
        return
    assert waiting == [1, 2, 3, 4]  # each step's norm waits, unread
    norms = their_hub.get_scalar('train/grad_norm').data[0]
    assert norms.tolist() == our_hub.get_scalar('train/grad_norm').data[0].tolist()
    assert len(norms) == 4 and min(norms) > 0.5  # (the clipping did bind)
