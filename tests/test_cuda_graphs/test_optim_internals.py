"""The private library state a captured training step reads or writes
(redet_plugin/cuda_graphs/optim_internals.py) still means what the step relies on, in the
installed mmengine and torch. A failure names the library and the attribute that changed."""
import warnings

import pytest
import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from redet_plugin.cuda_graphs.optim_internals import (accumulative_counts, count_backward,
                                                      scale_update_param,
                                                      set_takes_scaler_tensors,
                                                      takes_scaler_tensors)


def _sgd(**kwargs):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1, **kwargs)


def _changed(library: str, attribute: str, what: str) -> str:
    return (f"{library}'s {attribute} changed: {what}; update "
            "redet_plugin/cuda_graphs/optim_internals.py for the installed version")


def test_count_backward_is_what_optim_wrapper_backward_counts():
    wrapper = OptimWrapper(_sgd())
    assert hasattr(wrapper, '_inner_count'), _changed(
        'mmengine', 'OptimWrapper._inner_count', 'the attribute is gone')
    p = wrapper.optimizer.param_groups[0]['params'][0]
    wrapper.backward((p * 2).sum())
    assert wrapper.inner_count == 1, _changed(
        'mmengine', 'OptimWrapper._inner_count', 'backward() no longer counts in it')
    count_backward(wrapper)
    assert wrapper.inner_count == 2, _changed(
        'mmengine', 'OptimWrapper._inner_count', 'the public inner_count no longer reads it')


def test_accumulative_counts_is_the_constructor_argument():
    for counts in (1, 3):
        wrapper = OptimWrapper(_sgd(), accumulative_counts=counts)
        assert getattr(wrapper, '_accumulative_counts', None) == counts, _changed(
            'mmengine', 'OptimWrapper._accumulative_counts',
            'it no longer holds the accumulative_counts argument')
        assert accumulative_counts(wrapper) == counts


class _RecordingScaler:
    """Stands in for AmpOptimWrapper's GradScaler: records what step() passes to update()."""

    def __init__(self):
        self.updates = []

    def unscale_(self, optimizer):
        pass

    def step(self, optimizer, **kwargs):
        pass

    def update(self, new_scale=None):
        self.updates.append(new_scale)


@pytest.mark.parametrize('loss_scale, expected', [(512.0, 512.0), ('dynamic', None)])
def test_scale_update_param_is_what_amp_step_passes_to_the_scaler(monkeypatch, loss_scale,
                                                                  expected):
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    # (AmpOptimWrapper refuses to be made without a GPU; its bookkeeping needs none)
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (without a GPU its GradScaler warns and disables)
        wrapper = AmpOptimWrapper(loss_scale=loss_scale, optimizer=_sgd())
    assert hasattr(wrapper, '_scale_update_param'), _changed(
        'mmengine', 'AmpOptimWrapper._scale_update_param', 'the attribute is gone')
    wrapper.loss_scaler = _RecordingScaler()
    wrapper.step()
    assert wrapper.loss_scaler.updates == [expected], _changed(
        'mmengine', 'AmpOptimWrapper._scale_update_param',
        f'step() passed {wrapper.loss_scaler.updates} to GradScaler.update, not [{expected}]')
    assert scale_update_param(wrapper) == expected


def test_fused_sgd_takes_the_scalers_tensors():
    assert takes_scaler_tensors(_sgd(fused=True)), _changed(
        'torch', 'Optimizer._step_supports_amp_scaling', 'SGD(fused=True) no longer sets it')
    assert not takes_scaler_tensors(_sgd())


def test_grad_scaler_hands_its_tensors_to_an_optimizer_that_takes_them():
    """What the captured AMP step relies on: GradScaler.step gives the scale and the inf flag
    to the optimizer as tensors (read on the device) instead of reading the flag itself."""
    optimizer = _sgd()
    set_takes_scaler_tensors(optimizer, True)
    seen = {}

    def step(*args, **kwargs):  # (records; a plain SGD step would refuse the tensors)
        seen.update(grad_scale=getattr(optimizer, 'grad_scale', None),
                    found_inf=getattr(optimizer, 'found_inf', None))

    optimizer.step = step
    scaler = torch.amp.GradScaler('cpu', init_scale=4.0)
    p = optimizer.param_groups[0]['params'][0]
    scaler.scale((p * 3).sum()).backward()
    scaler.step(optimizer)
    assert isinstance(seen.get('found_inf'), torch.Tensor) and \
        isinstance(seen.get('grad_scale'), torch.Tensor), _changed(
            'torch', 'Optimizer._step_supports_amp_scaling',
            f'GradScaler.step no longer hands the optimizer grad_scale and found_inf ({seen})')
