"""The captured training step (cuda_graph_step) skips a step whose loss is not finite as the eager
step does (the wrapper's guard runs inside the graph: redet_plugin/utils/nonfinite_guard.py):
the parameters, the optimizer state and the BN statistics stay as they were, the next replay
trains on, and nothing waits for the GPU. The loss is poisoned through a device tensor that the
graph reads in place.

CPU: step_body (what a graph captures), run eagerly. GPU: captured steps; eager guarded steps on
the GPU. The eager CPU path: tests/test_engine/test_nonfinite_steps.py.
"""
import pytest
import torch
from mmengine.logging import MessageHub

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.utils.deferred_scalars import attach_queue, detach_queue
from redet_plugin.testing import waits_for_nothing
from redet_plugin.utils.nonfinite_guard import GRADIENTS_NOT_FINITE, LOSS_NOT_FINITE
from tests.test_cuda_graphs.test_step_graphs import (_batch, _captured, _detector, _update_gaps,
                                                     _wrapper)
from tests.test_engine.test_nonfinite_steps import NAN, _assert_same, _state

BOTH = LOSS_NOT_FINITE + GRADIENTS_NOT_FINITE
AMP_SCALE = dict(loss_scale=dict(init_scale=2.0 ** 10))  # (no float16 overflow in the tiny model)


@pytest.fixture
def log_lines(monkeypatch):
    """The lines StepGraphs logs (through mmengine's print_log)."""
    from redet_plugin.cuda_graphs import graph_cache
    lines = []
    monkeypatch.setattr(graph_cache, 'print_log', lambda msg, **kwargs: lines.append(msg))
    return lambda: list(lines)


def _poisoned(model, device):
    """The factor (a tensor on `device`, 1 by default) that the detector's loss is multiplied
    by: a captured step reads it in place, so filling it poisons the next replay."""
    factor = torch.ones((), device=device)
    parse_losses = model.parse_losses

    def poisoned(losses):
        loss, log_vars = parse_losses(losses)
        return loss * factor, log_vars
    model.parse_losses = poisoned
    return factor


def test_the_captured_step_body_skips_a_nonfinite_step():
    """step_body with lr read from a tensor (fused SGD), eagerly on the CPU: a poisoned step
    leaves the model, SGD's momentum and the BN statistics as they were; its flag says why."""
    from redet_plugin.cuda_graphs.step_graphs import _device_lr, step_body
    from redet_plugin.structures.gt_padding import pad_gt_instances
    model = _detector()
    model.step_graphs = None
    wrapper = _wrapper(model, guarded=True)
    factor = _poisoned(model, 'cpu')
    states, flags = [], []
    for step, poison in enumerate([1.0, NAN, 1.0]):
        data = model.data_preprocessor(_batch(num_boxes=(3, 2), seed=step), True)
        for sample in data['data_samples']:
            sample.gt_instances = pad_gt_instances(sample.gt_instances, 8)
        factor.fill_(poison)
        lrs = [torch.tensor(g['lr']) for g in wrapper.optimizer.param_groups]
        with _device_lr(wrapper.optimizer, lrs):
            _, values, _, flagged = step_body(model, data['inputs'], data['data_samples'],
                                              wrapper)
        assert flagged
        flags.append(values[-1].item())
        states.append(_state(model, wrapper))
    assert flags == [0, BOTH, 0]
    _assert_same(states[1], states[0])
    assert any(not torch.equal(v, states[1]['model'][k]) for k, v in states[2]['model'].items())


# ---- on the GPU ---------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'amp'])
def test_a_skipped_replay_leaves_the_model_as_it_was_and_the_next_one_trains(optimizer, amp,
                                                                           log_lines):
    model = _detector('cuda', warmup_iters=1, min_gt_capacity=16)
    wrapper = _wrapper(model, optimizer, amp, guarded=True, **(AMP_SCALE if amp else {}))
    factor = _poisoned(model, 'cuda')
    states, flags, scales = [], [], []
    for step, poison in enumerate([1.0, 1.0, NAN, 1.0]):  # warm-up, capture + replay, replays
        factor.fill_(poison)
        model.train_step(_batch('cuda', (3, 5), seed=step), wrapper)
        flags.append(wrapper.nonfinite_guard.take_flag().item())
        states.append(_state(model, wrapper))
        if amp:
            scales.append(wrapper.loss_scaler.get_scale())
    assert model.step_graphs.failed is None, model.step_graphs.failed
    assert len(model.step_graphs) == 1
    assert any('captured a training step' in line for line in log_lines())
    assert flags == [0, 0, BOTH, 0]
    _assert_same(states[2], states[1])  # weights, BN statistics, momentum / moments and counts
    floats = {k: v for k, v in states[3]['model'].items() if v.is_floating_point()}
    assert all(torch.isfinite(v).all() for v in floats.values())
    assert any(not torch.equal(v, states[2]['model'][k]) for k, v in floats.items())
    if amp:  # (GradScaler lowers its scale after the skipped step, as it should)
        assert scales[2] == scales[1] / 2 and scales[3] == scales[2]


@pytest.mark.cuda
def test_after_a_skipped_replay_the_next_one_is_that_from_the_state_before_it():
    """A skipped replay leaves nothing behind that the next replay reads: batch 3 replayed after
    it gives, within one backward's rounding (atomic sums), the weights that batch 3 replayed
    from the state before it gives (that state put back in place: the graph reads the same
    tensors); and not what batch 3 after a step taken on batch 2 gives. Within one run:
    separate runs of this tiny model drift apart by up to a quarter of their update."""
    model = _detector('cuda', warmup_iters=1, min_gt_capacity=16)
    wrapper = _wrapper(model, 'SGD', guarded=True)
    factor = _poisoned(model, 'cuda')

    def step(seed, poison=1.0):
        factor.fill_(poison)
        torch.cuda.manual_seed(100 + seed)  # (the same draws for the same batch)
        model.train_step(_batch('cuda', (3, 5), seed=seed), wrapper)

    def put_back(saved):
        with torch.no_grad():
            for name, tensor in tensors.items():
                tensor.copy_(saved[name])

    def weights():  # (the floating-point ones: the BN batch counts differ in the control)
        return {k: v.detach().clone() for k, v in model.state_dict().items()
                if v.is_floating_point()}

    step(0)
    step(1)  # (warm-up, capture + replay: momentum buffers exist from here)
    tensors = dict(model.state_dict(keep_vars=True),
                   **{f'momentum {i}': state['momentum_buffer']
                      for i, state in enumerate(wrapper.optimizer.state.values())})
    saved = {name: t.detach().clone() for name, t in tensors.items()}
    step(2, NAN)
    step(3)
    after_skip = weights()
    put_back(saved)
    step(3)
    from_before = weights()
    put_back(saved)
    step(2)
    step(3)
    after_step = weights()
    assert model.step_graphs.failed is None and len(model.step_graphs) == 1
    start = {k: saved[k] for k in from_before}
    gaps = _update_gaps(after_skip, from_before, start)
    control = _update_gaps(after_step, from_before, start)
    assert max(gaps.values()) < 1e-2, sorted(gaps.items(), key=lambda kv: -kv[1])[:5]
    assert max(control.values()) > 0.3, sorted(control.items(), key=lambda kv: -kv[1])[:5]


@pytest.mark.cuda
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'amp'])
def test_a_skipped_replay_waits_for_nothing(amp):
    model = _detector('cuda', warmup_iters=1)
    wrapper = _wrapper(model, amp=amp, guarded=True, **(AMP_SCALE if amp else {}))
    factor = _poisoned(model, 'cuda')
    _captured(model, wrapper)
    wrapper.nonfinite_guard.take_flag()
    data = _batch('cuda', (4, 2), seed=5)
    hub = MessageHub.get_current_instance()
    attach_queue(hub)  # as RedetRuntimeInfoHook does: the norm and the flag wait unread
    factor.fill_(NAN)
    try:
        with waits_for_nothing():
            model.train_step(data, wrapper)
            flag = wrapper.nonfinite_guard.take_flag()
    finally:
        detach_queue(hub)
    assert flag.item() == BOTH


@pytest.mark.cuda
@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'amp'])
def test_an_eager_skipped_step_on_the_gpu_waits_for_nothing(optimizer, amp):
    """Eager steps (no graphs): AdamW's step counts are moved to the GPU (capturable), where
    the flag can put them back."""
    model = _detector('cuda')
    model.step_graphs = None
    wrapper = _wrapper(model, optimizer, amp, guarded=True, **(AMP_SCALE if amp else {}))
    factor = _poisoned(model, 'cuda')
    for seed in range(2):  # (warm: anchors, momentum buffers, Adam's moments)
        model.train_step(_batch('cuda', (3, 5), seed=seed), wrapper)
    before = _state(model, wrapper)
    data = _batch('cuda', (3, 5), seed=2)
    hub = MessageHub.get_current_instance()
    attach_queue(hub)
    factor.fill_(NAN)
    try:
        with waits_for_nothing():
            model.train_step(data, wrapper)
    finally:
        detach_queue(hub)
    _assert_same(_state(model, wrapper), before)
    if optimizer == 'AdamW':
        assert wrapper.optimizer.param_groups[0]['capturable']
        assert all(s['step'].is_cuda for s in wrapper.optimizer.state.values())
