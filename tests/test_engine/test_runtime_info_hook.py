"""RedetRuntimeInfoHook gives the message hub the histories of mmengine's RuntimeInfoHook (same
values, counts, order and key order), through an epoch end and a checkpoint, and reads values
back only where something reads the histories, in one transfer each time."""
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import LoggerHook
from mmengine.hooks import RuntimeInfoHook as MMEngineRuntimeInfoHook
from mmengine.logging import MessageHub
from mmengine.registry import HOOKS as ROOT_HOOKS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.engine import RuntimeInfoHook, defer_scalar

from ._read_guard import ReadGuard, guarded, reads_allowed

EPOCH_LEN, ITERS, INTERVAL, CHECKPOINT_AT = 5, 7, 3, 5
# where the hook reads: the first iteration (new keys), the LoggerHook's interval, the epoch's
# end, the checkpoint, the last iteration
READ_AT = {0, 2, 4, CHECKPOINT_AT, 6}


class _Loader:
    dataset = SimpleNamespace()

    def __len__(self):
        return EPOCH_LEN


class _Runner:
    def __init__(self):
        name = f'hook-test-{uuid.uuid4().hex}'
        self.message_hub = MessageHub.get_instance(name)
        self.hooks = [LoggerHook(interval=INTERVAL)]
        self.train_dataloader = _Loader()
        self.epoch, self.iter, self.max_epochs, self.max_iters = 0, 0, 2, ITERS
        self.cfg, self.seed, self.experiment_name = SimpleNamespace(pretty_text=''), 0, name
        self.optim_wrapper = SimpleNamespace(get_lr=lambda: dict(lr=[0.01 * (self.iter + 1)]))


def _values(it):
    """One iteration's scalars: tensors (losses, the deferred norm) and a plain number."""
    rng = np.random.default_rng(it)
    return dict(loss=rng.random() * 3, loss_cls=rng.random(), grad_norm=rng.random() * 40,
                time=0.1 * it)


def _train(hook, tensor, record_norm):
    """What the Runner calls on the hook for ITERS iterations, with a checkpoint in between;
    the hub's state_dict at the checkpoint and at the end."""
    runner = _Runner()
    hub, saved = runner.message_hub, {}
    hook.before_run(runner)
    hook.before_train(runner)
    for it in range(ITERS):
        runner.epoch, batch_idx = divmod(it, EPOCH_LEN)
        runner.iter = it
        if batch_idx == 0:
            hook.before_train_epoch(runner)
        hook.before_train_iter(runner, batch_idx)
        hub.update_scalar('train/data_time', 0.01 * it)  # (IterTimerHook, before the step)
        v = _values(it)
        record_norm(hub, tensor(v['grad_norm']))  # (the optim wrapper, in the step)
        outputs = dict(loss=tensor(v['loss']), loss_cls=tensor(v['loss_cls']), num_gts=it % 3)
        with reads_allowed(it in READ_AT):
            hook.after_train_iter(runner, batch_idx, outputs=outputs)
            if it == CHECKPOINT_AT:  # (Runner.save_checkpoint: the hub's state, then the hook)
                checkpoint = dict(message_hub=hub.state_dict())
                hook.before_save_checkpoint(runner, checkpoint)
                saved['checkpoint'] = checkpoint['message_hub']
        saved.setdefault('reads', []).append(ReadGuard.reads)
        hub.update_scalar('train/time', v['time'])  # (IterTimerHook, after this hook)
        if batch_idx == EPOCH_LEN - 1:
            hook.after_train_epoch(runner)
    with reads_allowed():
        hook.after_train(runner)
        hook.after_run(runner)
    saved['end'] = hub.state_dict()
    return saved


def _mmengine_norm(hub, norm):
    hub.update_scalar('train/grad_norm', float(norm))


def _deferred_norm(hub, norm):
    defer_scalar('train/grad_norm', norm, message_hub=hub)


def _assert_same_state(state, expected):
    assert list(state['log_scalars']) == list(expected['log_scalars'])
    for key, buffer in expected['log_scalars'].items():
        for got, want in zip(state['log_scalars'][key].data, buffer.data):
            assert got.dtype == want.dtype and np.array_equal(got, want), key
    assert state['resumed_keys'] == expected['resumed_keys']


def test_registered_under_the_one_naming_scheme():
    assert HOOKS.get('RedetRuntimeInfoHook') is RuntimeInfoHook
    assert ROOT_HOOKS.get('mmdet.RedetRuntimeInfoHook') is RuntimeInfoHook
    assert 'RuntimeInfoHook' not in HOOKS.module_dict


def test_histories_equal_mmengine_and_reads_only_where_read():
    expected = _train(MMEngineRuntimeInfoHook(), torch.tensor, _mmengine_norm)
    ours = _train(RuntimeInfoHook(), guarded, _deferred_norm)
    _assert_same_state(ours['checkpoint'], expected['checkpoint'])
    _assert_same_state(ours['end'], expected['end'])
    assert len(ours['end']['log_scalars']['train/loss'].data[0]) == ITERS
    # one read-back (one tolist of the stacked values) where it reads, none elsewhere
    assert ours['reads'] == [1 if it in READ_AT else 0 for it in range(ITERS)]


def test_the_guard_catches_mmengine_reading_every_iteration():
    with pytest.raises(AssertionError, match='a value was read'):
        _train(MMEngineRuntimeInfoHook(), guarded, _mmengine_norm)


def test_a_checkpoint_after_a_flush_is_left_as_it_is():
    runner = _Runner()
    hook = RuntimeInfoHook()
    hook.before_run(runner)
    checkpoint = dict(message_hub='as saved')
    hook.before_save_checkpoint(runner, checkpoint)  # nothing waiting: nothing to redo
    assert checkpoint['message_hub'] == 'as saved'
    hook.after_run(runner)
