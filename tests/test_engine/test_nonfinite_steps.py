"""A training step whose loss or gradients are not finite leaves the parameters, the optimizer
state and the BN statistics as they were (RedetOptimWrapper, RedetAmpOptimWrapper: the guard of
redet_plugin/utils/nonfinite_guard.py), decided without reading a value on the host;
RedetNonFiniteStepsHook names each such step with its iteration and images, and stops a run
after more than max_consecutive_nonfinite in a row. The non-finite values are injected: the loss
(or a gradient) is multiplied by NaN or infinity at chosen steps.

The captured step runs the same guard: tests/test_cuda_graphs/test_nonfinite_captured_steps.py.
"""
import copy
import glob
import os.path as osp
import uuid
import warnings

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.model import BaseModel
from mmengine.optim import AmpOptimWrapper as MMEngineAmpOptimWrapper
from mmengine.structures import BaseDataElement
from torch import nn

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.engine import (AmpOptimWrapper, NonFiniteStepsError, NonFiniteStepsHook,
                                 OptimWrapper)
from redet_plugin.utils import deferred_scalars
from redet_plugin.utils.deferred_scalars import attach_queue
from redet_plugin.utils.nonfinite_guard import GRADIENTS_NOT_FINITE, LOSS_NOT_FINITE

NAN, INF = float('nan'), float('inf')


def _net(device='cpu'):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
                         nn.Linear(8, 1)).to(device).train()


def _optimizer(net, name):
    if name == 'SGD':
        return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return torch.optim.AdamW(net.parameters(), lr=0.01)


def _batch(seed, device='cpu'):
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(seed)).to(device)


def _step(wrapper, net, batch, poison=1.0):
    """One training step as mmengine's train_step makes it, with the loss times `poison`."""
    with wrapper.optim_context(net):
        loss = (net(batch) ** 2).mean() * poison
    wrapper.update_params(loss)


def _state(net, wrapper) -> dict:
    """The parameters, BN statistics and optimizer state, copied."""
    return dict(model={k: v.detach().clone() for k, v in net.state_dict().items()},
                optimizer=copy.deepcopy(wrapper.optimizer.state_dict()['state']))


def _assert_same(a, b, path='state'):
    """Equal tensors (exactly) in equal structures."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same(a[key], b[key], f'{path}.{key}')
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


@pytest.fixture
def hub():
    return MessageHub.get_instance(f'nonfinite-test-{uuid.uuid4().hex}')


@pytest.fixture
def amp_on_the_cpu(monkeypatch):
    """Makes AmpOptimWrapper (which refuses to be made without a GPU) with a CPU GradScaler."""
    from mmengine.optim.optimizer import amp_optimizer_wrapper
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)

    def make(wrapper_type, optimizer, device='cpu', **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # (the CUDA GradScaler it makes warns and disables)
            wrapper = wrapper_type(optimizer=optimizer, **kwargs)
        wrapper.loss_scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8)
        return wrapper
    return make


# ---- the guard ----------------------------------------------------------------------------------
@pytest.mark.parametrize('poison', [NAN, INF], ids=['nan', 'inf'])
@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
@pytest.mark.parametrize('clip', [False, True], ids=['no_clip', 'clip'])
def test_a_nonfinite_step_leaves_the_model_and_the_optimizer_as_they_were(poison, optimizer,
                                                                        clip):
    net = _net()
    wrapper = OptimWrapper(_optimizer(net, optimizer),
                           clip_grad=dict(max_norm=1.0) if clip else None)
    _step(wrapper, net, _batch(0))
    before = _state(net, wrapper)
    _step(wrapper, net, _batch(1), poison)
    _assert_same(_state(net, wrapper), before)  # parameters, momentum / moments, BN statistics
    assert wrapper.nonfinite_guard.take_flag().item() == LOSS_NOT_FINITE + GRADIENTS_NOT_FINITE
    _step(wrapper, net, _batch(2))
    assert wrapper.nonfinite_guard.take_flag().item() == 0
    after = _state(net, wrapper)
    assert all(torch.isfinite(v).all() for v in after['model'].values() if v.is_floating_point())
    assert not torch.equal(after['model']['0.weight'], before['model']['0.weight'])


@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
@pytest.mark.parametrize('skipped', [0, 1], ids=['first_step', 'later_step'])
def test_the_steps_after_a_skipped_one_are_those_of_a_run_without_its_batch(optimizer, skipped):
    """Also where the skipped step is the first: the optimizer state it made (SGD's momentum,
    AdamW's moments and count) is zero, where torch's own first step starts from."""
    states = []
    for batches, poisoned in (([0, 1, 2, 3], skipped), ([b for b in [0, 1, 2, 3] if b != skipped],
                                                      None)):
        net = _net()
        wrapper = OptimWrapper(_optimizer(net, optimizer))
        for batch in batches:
            _step(wrapper, net, _batch(batch), NAN if batch == poisoned else 1.0)
        states.append(_state(net, wrapper)['model'])
    _assert_same(*states)


def test_a_nonfinite_gradient_of_a_finite_loss_is_skipped():
    net = _net()
    wrapper = OptimWrapper(_optimizer(net, 'SGD'))
    poison = torch.ones(())
    net[0].weight.register_hook(lambda grad: grad * poison)
    _step(wrapper, net, _batch(0))
    before = _state(net, wrapper)
    poison.fill_(INF)
    _step(wrapper, net, _batch(1))
    assert wrapper.nonfinite_guard.take_flag().item() == GRADIENTS_NOT_FINITE
    _assert_same(_state(net, wrapper), before)


def test_with_gradient_accumulation_the_statistics_of_every_accumulated_forward_are_undone():
    net = _net()
    wrapper = OptimWrapper(_optimizer(net, 'SGD'), accumulative_counts=2)
    for batch in (0, 1):
        _step(wrapper, net, _batch(batch))
    assert wrapper.nonfinite_guard.take_flag().item() == 0  # (one step, after two batches)
    before = _state(net, wrapper)
    _step(wrapper, net, _batch(2), NAN)  # (the first of two: no step yet)
    assert wrapper.nonfinite_guard.take_flag() is None
    _step(wrapper, net, _batch(3))
    assert wrapper.nonfinite_guard.take_flag().item() == LOSS_NOT_FINITE + GRADIENTS_NOT_FINITE
    _assert_same(_state(net, wrapper), before)


def test_amp_skips_as_mmengines_amp_and_also_keeps_the_bn_statistics(amp_on_the_cpu):
    """RedetAmpOptimWrapper (bfloat16 autocast on the CPU, a CPU GradScaler): the parameters and
    the loss scale of mmengine's AmpOptimWrapper at every step, first and later skipped steps
    included; the BN statistics, which mmengine's keeps only from the skipped step's optimizer
    update, not from its forward, as they were."""
    nets = [_net(), _net()]
    theirs, ours = [amp_on_the_cpu(t, _optimizer(n, 'SGD'), clip_grad=dict(max_norm=1.0))
                    for t, n in ((MMEngineAmpOptimWrapper, nets[0]), (AmpOptimWrapper, nets[1]))]
    for step, poison in enumerate([NAN, 1.0, 1.0, INF, 1.0]):
        before = _state(nets[1], ours)
        for net, wrapper in zip(nets, (theirs, ours)):
            _step(wrapper, net, _batch(step), poison)
        for (name, a), b in zip(nets[0].named_parameters(), nets[1].parameters()):
            assert torch.equal(a, b), (step, name)
        assert ours.loss_scaler.get_scale() == theirs.loss_scaler.get_scale()
        if poison != 1.0 and step > 0:
            _assert_same(_state(nets[1], ours), before)
        elif poison != 1.0:  # (a skipped first step: its momentum buffers are made as zeros)
            _assert_same(_state(nets[1], ours)['model'], before['model'])
            assert all(not v['momentum_buffer'].any()
                       for v in ours.optimizer.state_dict()['state'].values())
    assert ours.loss_scaler.get_scale() == 2.0 ** 6  # (halved at each skipped step)


@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'amp'])
def test_the_step_reads_nothing_back(amp, hub, amp_on_the_cpu, monkeypatch):
    """The whole step, guard included, on the meta device, where any read of a value (.item(),
    bool(t), a data-dependent shape) raises: the decision stays on the device."""
    monkeypatch.setattr(MessageHub, 'get_current_instance', classmethod(lambda cls: hub))
    net = _net('meta')
    optimizer = _optimizer(net, 'SGD')
    if amp:
        wrapper = amp_on_the_cpu(AmpOptimWrapper, optimizer, 'meta', clip_grad=dict(max_norm=1.0))
    else:
        wrapper = OptimWrapper(optimizer, clip_grad=dict(max_norm=1.0))
    attach_queue(hub)  # (as RedetRuntimeInfoHook does: the gradient norm waits unread)
    try:
        for step in range(3):  # (the first step makes the momentum buffers)
            _step(wrapper, net, _batch(step, 'meta'))
            flag = wrapper.nonfinite_guard.take_flag()
            assert flag.device.type == 'meta' and flag.shape == ()
    finally:
        deferred_scalars._QUEUES.pop(hub)  # (a flush would read the meta values)


def test_adam_on_a_gpu_keeps_its_step_count_on_the_device():
    """(The guard's switch, on a stand-in: a CUDA parameter is not needed to see the setting.)"""
    from redet_plugin.utils.nonfinite_guard import _keep_step_counts_on_device
    net = _net()
    optimizer = _optimizer(net, 'AdamW')
    _keep_step_counts_on_device(optimizer)
    assert optimizer.param_groups[0]['capturable'] is False  # (on the CPU: nothing to do)
    if torch.cuda.is_available():
        optimizer = _optimizer(_net('cuda'), 'AdamW')
        _keep_step_counts_on_device(optimizer)
        assert optimizer.param_groups[0]['capturable'] is True


# ---- the hook, in a runner ----------------------------------------------------------------------
class _Tiny(BaseModel):
    """A model whose loss is multiplied by `poison` (set by _Poison before each iteration)."""

    def __init__(self):
        super().__init__()
        self.net = _net()
        self.poison = torch.ones(())

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.net(torch.stack(inputs))
        return dict(loss=(out ** 2).mean() * self.poison) if mode == 'loss' else out


class _Images(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return dict(inputs=torch.randn(4, generator=torch.Generator().manual_seed(index)),
                    data_samples=BaseDataElement(metainfo=dict(img_path=f'img_{index}.png')))


class _Poison(Hook):
    """Sets the loss's factor before each iteration: `poisoned` maps 1-based iterations to it;
    records the state after each iteration."""

    priority = 'LOWEST'

    def __init__(self, poisoned):
        self.poisoned, self.states = poisoned, []

    def before_train(self, runner):
        self.states.append(_state(runner.model.net, runner.optim_wrapper))

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        runner.model.poison.fill_(self.poisoned.get(runner.iter + 1, 1.0))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.states.append(_state(runner.model.net, runner.optim_wrapper))


def _run(tmp_path, poisoned, iterations=6, max_consecutive_nonfinite=2, interval=2):
    """Trains _Tiny for `iterations` (batches of 2 images, a log line every `interval`); the
    poison hook and the log's text."""
    from mmengine.runner import Runner
    poison = _Poison(poisoned)
    runner = Runner(
        model=_Tiny(), work_dir=str(tmp_path), experiment_name=f'nonfinite-{uuid.uuid4().hex}',
        train_dataloader=dict(dataset=_Images(), batch_size=2, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='pseudo_collate')),
        train_cfg=dict(by_epoch=False, max_iters=iterations),
        optim_wrapper=dict(type='RedetOptimWrapper',
                           optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        default_scope='mmdet',
        default_hooks=dict(
            runtime_info=dict(type='RedetRuntimeInfoHook'),
            logger=dict(type='LoggerHook', interval=interval), checkpoint=None,
            nonfinite_steps=dict(type='RedetNonFiniteStepsHook',
                                 max_consecutive_nonfinite=max_consecutive_nonfinite)),
        custom_hooks=[poison],
        log_processor=dict(by_epoch=False))
    error = None
    try:
        runner.train()
    except NonFiniteStepsError as raised:
        error = raised
    log_file, = glob.glob(osp.join(str(tmp_path), '*', '*.log'))
    with open(log_file) as f:
        return poison, f.read(), error


def test_the_log_names_each_skipped_step_with_its_iteration_and_images(tmp_path):
    poison, log, error = _run(tmp_path, {3: NAN, 5: INF})
    assert error is None
    lines = [line for line in log.splitlines() if 'non-finite step at' in line]
    assert len(lines) == 2, lines
    assert lines[0].endswith('non-finite step at iteration 3: the loss is not finite; skipped, '
                             'the parameters, optimizer state and BN statistics are as before it '
                             '(1 so far); images: img_4.png, img_5.png'), lines[0]
    assert 'iteration 5' in lines[1] and '(2 so far); images: img_8.png, img_9.png' in lines[1]
    assert ('2 training steps were skipped: the loss or gradients were not finite (at '
            'iteration 3, iteration 5)') in log
    states = poison.states  # (before training, then after each iteration)
    _assert_same(states[3], states[2])
    _assert_same(states[5], states[4])
    assert not torch.equal(states[6]['model']['0.weight'], states[5]['model']['0.weight'])


def test_more_than_the_limit_in_a_row_stop_the_run_with_one_line(tmp_path):
    """Three in a row over two log intervals (a log after iterations 2 and 4: the flags are read
    there): every flag is read, so the streak is found across the reads."""
    poison, log, error = _run(tmp_path, {2: NAN, 3: NAN, 4: NAN}, max_consecutive_nonfinite=2)
    assert isinstance(error, NonFiniteStepsError)
    assert str(error) == (
        '3 training steps in a row had a non-finite loss or gradients (iteration 2 to '
        'iteration 4), more than max_consecutive_nonfinite=2: the training diverged; lower the '
        'learning rate or check the images logged for those steps '
        '(default_hooks.nonfinite_steps.max_consecutive_nonfinite sets the limit)')
    # (stopped where the flags were read after iteration 4, before _Poison recorded it)
    assert len(poison.states) == 1 + 3
    _assert_same(poison.states[3], poison.states[1])


def test_as_many_as_the_limit_in_a_row_do_not_stop_the_run(tmp_path):
    poison, log, error = _run(tmp_path, {2: NAN, 3: NAN, 5: NAN}, max_consecutive_nonfinite=2)
    assert error is None and len(poison.states) == 1 + 6
    assert '3 training steps were skipped' in log


def test_the_limit_is_checked_when_the_hook_is_made():
    with pytest.raises(ValueError, match='max_consecutive_nonfinite must be an int >= 0'):
        NonFiniteStepsHook(max_consecutive_nonfinite=-1)
    assert NonFiniteStepsHook().max_consecutive_nonfinite == 20


# ---- tools/train.py on the tiny config ----------------------------------------------------------
class PoisonedDetectorLoss(Hook):
    """Multiplies the detector's loss by NaN at the given 1-based iterations (a device tensor,
    also read by a captured step); records the model's and optimizer's state after each
    iteration."""

    priority = 'LOWEST'
    states = []

    def __init__(self, iterations):
        self.iterations = iterations

    def before_train(self, runner):
        from mmengine.model import is_model_wrapper
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.model, parse_losses = model, model.parse_losses
        self.factor = torch.ones((), device=next(model.parameters()).device)

        def poisoned(losses):
            loss, log_vars = parse_losses(losses)
            log_vars['loss'] = loss * self.factor
            return log_vars['loss'], log_vars
        model.parse_losses = poisoned
        type(self).states = [_state(model, runner.optim_wrapper)]

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.factor.fill_(NAN if runner.iter + 1 in self.iterations else 1.0)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.states.append(_state(self.model, runner.optim_wrapper))


def test_train_tool_names_the_skipped_steps_and_stops_in_one_line(tmp_path):
    """The tiny config (AdamW, clipping, BN in training mode), a log after iteration 2 of 3:
    iteration 2 is skipped and logged with its images; iteration 3 makes two in a row, more
    than max_consecutive_nonfinite=1, and the tool stops with one line."""
    import sys
    from mmengine.registry import HOOKS
    from tests.test_engine.test_train_logs import ROOT, TINY, _options
    HOOKS.register_module(module=PoisonedDetectorLoss, force=True)
    config = tmp_path / 'poisoned.py'
    config.write_text(f"_base_ = [{TINY!r}]\n"
                      "custom_hooks = [dict(type='PoisonedDetectorLoss', iterations=[2, 3])]\n"
                      "default_hooks = dict(nonfinite_steps=dict(max_consecutive_nonfinite=1))\n")
    sys.path.insert(0, ROOT)
    from tools.train import main
    with pytest.raises(SystemExit) as stopped:
        main([str(config), '--work-dir', str(tmp_path / 'work'), '--cfg-options',
              *_options(tmp_path / 'data')])
    assert str(stopped.value.code) == (
        'error: 2 training steps in a row had a non-finite loss or gradients (iteration 2 '
        '(epoch 1, batch 2) to iteration 3 (epoch 1, batch 3)), more than '
        'max_consecutive_nonfinite=1: the training diverged; lower the learning rate or check '
        'the images logged for those steps (default_hooks.nonfinite_steps.'
        'max_consecutive_nonfinite sets the limit)')
    log_file, = glob.glob(str(tmp_path / 'work' / '*' / '*.log'))
    with open(log_file) as f:
        lines = [line for line in f if 'non-finite step at' in line]
    assert len(lines) == 2, lines
    assert 'non-finite step at iteration 2 (epoch 1, batch 2): the loss is not finite' in lines[0]
    images = lines[0].rstrip().rpartition('images: ')[2].split(', ')
    assert len(images) == 2 and all(osp.isfile(path) for path in images), images
    states = PoisonedDetectorLoss.states  # (before training; after iterations 1 and 2)
    assert len(states) == 3
    _assert_same(states[2], states[1])  # weights, BN statistics, AdamW's moments and counts
    assert any(not torch.equal(v, states[0]['model'][k]) for k, v in states[1]['model'].items())
    assert any('running_mean' in k for k in states[1]['model'])


@pytest.mark.parametrize('configured, expected', [('RedetOptimWrapper', 'RedetAmpOptimWrapper'),
                                                  ('OptimWrapper', 'AmpOptimWrapper')])
def test_train_tool_amp_keeps_the_guard(configured, expected, monkeypatch):
    """--amp turns RedetOptimWrapper into RedetAmpOptimWrapper (mmengine's own stays mmengine's)."""
    import sys
    from tests.test_engine.test_train_logs import ROOT, TINY
    sys.path.insert(0, ROOT)
    from tools import train
    monkeypatch.setattr(train, 'gpu_available', lambda: True)
    args = train.parse_args([TINY, '--amp', '--cfg-options', f'optim_wrapper.type={configured}'])
    assert train.build_config(args).optim_wrapper.type == expected
