"""ReDet's `cuda_graph_step`: the whole training step replayed as one CUDA graph.

CPU: the option, the reasons for running eagerly, the eager fallback's results. GPU: captured
steps give the eager steps' parameters, follow the lr schedule, wait for nothing, and capture
again or run eagerly where they must.
"""
import copy

import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.optim import AmpOptimWrapper, OptimWrapper

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.cuda_graphs import StepGraphs
from redet_plugin.cuda_graphs.step_graphs import gt_capacity
from redet_plugin.utils.deferred_scalars import attach_queue, detach_queue
from redet_plugin.testing import waits_for_nothing
from tests._helpers import free_port, full_fp32, make_samples, tiny_detector


def _detector(device='cpu', **step_options):
    model = tiny_detector(device)
    model.step_graphs = StepGraphs(**step_options)
    return model.train()


def _batch(device='cpu', num_boxes=(3, 0), seed=0):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, (3, 128, 128), generator=g, dtype=torch.uint8).to(device)
              for _ in range(2)]
    return dict(inputs=images, data_samples=[s.to(device) for s in make_samples(
        num_boxes=num_boxes)])


def _padded_batch(seed):
    """A CPU batch whose gts are padded as a graph pads them (the eager step then draws the
    random numbers of a captured one)."""
    from redet_plugin.structures.gt_padding import pad_gt_instances
    data = _batch(num_boxes=(3, 2), seed=seed)
    for sample in data['data_samples']:
        sample.gt_instances = pad_gt_instances(sample.gt_instances, 8)
    return data


def _captured(model, wrapper, num_boxes=(3, 0)):
    """Three steps (warm-up, capture + replay, replay) with warmup_iters=1: a graph kept."""
    for seed in range(3):
        model.train_step(_batch('cuda', num_boxes, seed=seed), wrapper)
    assert model.step_graphs.failed is None, model.step_graphs.failed
    assert len(model.step_graphs) == 1


def _wrapper(model, optimizer='SGD', amp=False, guarded=False, **kwargs):
    """mmengine's (Amp)OptimWrapper, or with guarded=True the plugin's, which skips non-finite
    steps."""
    from redet_plugin import engine
    params = model.parameters()
    opt = (torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
           if optimizer == 'SGD' else getattr(torch.optim, optimizer)(params, lr=1e-3))
    wrapper_type = ((engine.AmpOptimWrapper if amp else engine.OptimWrapper) if guarded else
                    (AmpOptimWrapper if amp else OptimWrapper))
    return wrapper_type(optimizer=opt, clip_grad=dict(max_norm=35, norm_type=2), **kwargs)


@pytest.fixture
def log_lines(monkeypatch):
    """The lines StepGraphs logs (through mmengine's print_log)."""
    from redet_plugin.cuda_graphs import graph_cache
    lines = []
    monkeypatch.setattr(graph_cache, 'print_log', lambda msg, **kwargs: lines.append(msg))
    return lambda: list(lines)


def test_gt_capacity_is_a_power_of_two_at_least_the_minimum():
    assert gt_capacity([3, 0], 64) == 64
    assert gt_capacity([], 16) == 16
    assert gt_capacity([65, 2], 64) == 128
    assert gt_capacity([128], 64) == 128
    assert gt_capacity([129], 1) == 256


def test_keys_that_share_a_warm_up_key_share_its_warm_up(monkeypatch):
    """graph_for's bookkeeping, with a stand-in capture: a second gt capacity of a warmed-up
    layout is captured at once; a new layout warms up first."""
    graphs = StepGraphs(warmup_iters=2)
    monkeypatch.setattr(graphs, 'capture', lambda key, *args: ('graph', key))

    def lookup(layout, capacity):
        return graphs.graph_for((layout, capacity), (), lambda: (), graphs.warmup_iters,
                                'layouts', 'a step', None, warmup_key=layout)

    assert [lookup('a', 64) for _ in range(2)] == [None, None]  # warm-up
    assert lookup('a', 64) == ('graph', ('a', 64))
    assert lookup('a', 128) == ('graph', ('a', 128))  # no second warm-up
    assert lookup('b', 64) is None and graphs.warming_up
    assert len(graphs) == 2
    graphs.max_graphs = 2
    assert lookup('c', 64) is None and not graphs.warming_up  # past max_graphs: no warm-up


def test_option_builds_step_graphs_or_refuses_clearly():
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from tests._helpers import tiny_model_cfg
    register_all_modules(init_default_scope=True)

    def build(option):
        return MODELS.build(tiny_model_cfg() | dict(cuda_graph_step=option))

    assert build(False).step_graphs is None
    assert isinstance(build(True).step_graphs, StepGraphs)
    assert build(dict(max_graphs=3)).step_graphs.max_graphs == 3
    with pytest.raises(TypeError, match='cuda_graph_step: expected a bool or a dict'):
        build('yes')
    with pytest.raises(ValueError, match='cuda_graph_step: min_gt_capacity must be an int >= 1'):
        StepGraphs(min_gt_capacity=0)


def test_one_switch_turns_every_graph_option_off():
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from tests._helpers import tiny_model_cfg
    register_all_modules(init_default_scope=True)
    every = dict(cuda_graph_features=True, cuda_graph_step=True, cuda_graph_predict=True)
    model = MODELS.build(tiny_model_cfg() | every | dict(cuda_graphs=False))
    assert (model.feature_graphs, model.step_graphs, model.predict_graphs) == (None, None, None)
    model = MODELS.build(tiny_model_cfg() | every)
    assert None not in (model.feature_graphs, model.step_graphs, model.predict_graphs)
    with pytest.raises(TypeError, match="cuda_graphs: expected True or False; got 'no'"):
        MODELS.build(tiny_model_cfg() | dict(cuda_graphs='no'))


class _OtherWrapper(OptimWrapper):
    pass


@pytest.mark.parametrize('case, reason', [
    ('wrapper', "_OtherWrapper: only mmengine's OptimWrapper and AmpOptimWrapper"),
    ('accumulation', 'gradient accumulation'),
    ('optimizer', 'Adagrad: only SGD, Adam and AdamW steps are captured'),
    ('device', 'the inputs are not on a CUDA device'),
])
def test_unsupported_steps_name_their_reason(case, reason):
    from redet_plugin.cuda_graphs.module_walk import ModuleWalk
    model = tiny_detector()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wrapper = {'wrapper': lambda: _OtherWrapper(opt),
               'accumulation': lambda: OptimWrapper(opt, accumulative_counts=2),
               'optimizer': lambda: OptimWrapper(torch.optim.Adagrad(model.parameters())),
               'device': lambda: OptimWrapper(opt)}[case]()
    said = StepGraphs().unsupported(torch.zeros(1), wrapper, ModuleWalk(model))
    assert said is not None and said.startswith(reason)


def test_sgd_with_dampening_waits_eagerly_for_its_first_step():
    from redet_plugin.cuda_graphs.module_walk import ModuleWalk
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
    said = StepGraphs().unsupported(torch.zeros(1), OptimWrapper(opt), ModuleWalk(model))
    assert said.startswith('SGD with dampening before its first step'), said
    model(torch.randn(4, 3)).sum().backward()
    opt.step()  # (it makes the momentum buffers)
    said = StepGraphs().unsupported(torch.zeros(1), OptimWrapper(opt), ModuleWalk(model))
    assert said == 'the inputs are not on a CUDA device'


@pytest.mark.parametrize('nesterov', [False, True])
def test_zero_momentum_buffers_give_sgds_first_step(nesterov):
    """Buffers made before a capture where no step made them: the steps from them equal
    torch's SGD making them in its first step (dampening 0), and existing ones are kept."""
    from redet_plugin.cuda_graphs.step_graphs import _start_momentum
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opts = [torch.optim.SGD([{'params': list(m.parameters())}, {'params': [frozen]}], lr=0.1,
                            momentum=0.9, nesterov=nesterov, weight_decay=1e-2) for m in models]
    _start_momentum(opts[1])
    buffers = [opts[1].state[p]['momentum_buffer'] for p in models[1].parameters()]
    assert all(torch.equal(b, torch.zeros_like(b)) for b in buffers)
    assert 'momentum_buffer' not in opts[1].state.get(frozen, {})
    x = torch.randn(4, 3)
    for _ in range(3):
        for model, opt in zip(models, opts):
            opt.zero_grad()
            (model(x) ** 2).sum().backward()
            opt.step()
    for ours, ref in zip(models[1].parameters(), models[0].parameters()):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    _start_momentum(opts[1])  # (buffers that exist are kept)
    assert [opts[1].state[p]['momentum_buffer'] for p in models[1].parameters()] == buffers


def test_eager_fallback_is_the_plain_train_step(log_lines):
    """On the CPU the option changes nothing but one line in the log."""
    results = []
    for with_graphs in (False, True):
        model = _detector()
        if not with_graphs:
            model.step_graphs = None
        wrapper = _wrapper(model)
        torch.manual_seed(1)
        log_vars = [model.train_step(_batch(seed=i), wrapper) for i in range(2)]
        results.append((log_vars, [p.detach().clone() for p in model.parameters()]))
    (ref_logs, ref_params), (logs, params) = results
    for ref, ours in zip(ref_logs, logs):
        assert ref.keys() == ours.keys()
        for key in ref:
            torch.testing.assert_close(ours[key], ref[key], rtol=0, atol=0)
    for ref, ours in zip(ref_params, params):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert log_lines() == ['cuda_graph_step: eager: the inputs are not on a CUDA device']


def test_capture_lr_context_restores_the_param_groups():
    from redet_plugin.cuda_graphs.step_graphs import _device_lr
    model = torch.nn.Linear(3, 2)
    for opt, device_key in ((torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 'fused'),
                            (torch.optim.AdamW(model.parameters(), lr=0.1), 'capturable')):
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        before = dict(opt.param_groups[0])
        lr = torch.tensor(0.2)
        with _device_lr(opt, [lr]):
            assert opt.param_groups[0]['lr'] is lr and opt.param_groups[0][device_key]
        assert opt.param_groups[0]['lr'] == before['lr'] == 0.1
        if device_key == 'fused':
            assert opt.param_groups[0]['fused'] == before['fused']


def _group_of_this_process(backend):
    """A process group of this process alone, ended after the test."""
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip('needs torch.distributed')
    dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{free_port()}', rank=0,
                            world_size=1)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


@pytest.fixture
def nccl_world_of_one():
    """An NCCL process group of this process alone (CUDA tensors)."""
    yield from _group_of_this_process('nccl')


@pytest.fixture
def gloo_world_of_one():
    """A gloo process group of this process alone (CPU tensors), with or without a GPU."""
    yield from _group_of_this_process('gloo')


@pytest.mark.parametrize('guarded', [False, True], ids=['mmengine', 'redet'])
def test_the_captured_step_body_is_the_eager_step(guarded):
    """What a graph captures (step_body with lr read from a tensor: fused SGD) gives the eager
    step's log values, gradient norm and parameters for the same draw, run eagerly here; with
    RedetOptimWrapper, through the same non-finite guard (a finite step: flag 0)."""
    from redet_plugin.cuda_graphs.step_graphs import _device_lr, step_body
    results = []
    for body in (False, True):
        model = _detector()
        model.step_graphs = None
        wrapper = _wrapper(model, guarded=guarded)
        for step in range(2):
            data = _padded_batch(seed=step)
            torch.manual_seed(10 + step)
            if body:
                data = model.data_preprocessor(data, True)
                lrs = [torch.tensor(g['lr']) for g in wrapper.optimizer.param_groups]
                with _device_lr(wrapper.optimizer, lrs):
                    names, values, norm_key, flagged = step_body(model, data['inputs'],
                                                                 data['data_samples'], wrapper)
                assert flagged == guarded
                if flagged:
                    assert values[-1].item() == 0  # (the guard's flag: a finite step)
                    values = values[:-1]
                log = dict(zip(names + [norm_key], values))
            else:
                log = model.train_step(data, wrapper)
                log['train/grad_norm'] = torch.tensor(
                    wrapper.message_hub.get_scalar('train/grad_norm').current())
        results.append((log, [p.detach().clone() for p in model.parameters()]))
    (ref_log, ref_params), (log, params) = results
    assert ref_log.keys() == log.keys() and 'train/grad_norm' in log
    for key in ref_log:
        torch.testing.assert_close(log[key].float(), ref_log[key].float(), rtol=1e-5, atol=1e-6)
    for ref, ours in zip(ref_params, params):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(params, tiny_detector().parameters()))


@pytest.mark.parametrize('guarded', [False, True], ids=['mmengine', 'redet'])
def test_warm_up_steps_run_the_graphs_body_on_padded_gts(guarded, monkeypatch):
    """The eager steps before a capture compute as the replays will: step_body on gts padded to
    the capacity, lr from float32 tensors (fused SGD), momentum buffers made as zeros. So they
    draw the replays' random numbers, and a resumed run, which warms up again, continues as the
    uninterrupted one (on a GPU: tests/test_tools/test_resume.py). Here on the CPU, its
    refusal of CPU inputs bypassed, against step_body called by hand."""
    from redet_plugin.cuda_graphs.step_graphs import (_device_lr, _padded_sample,
                                                      _start_momentum, step_body)
    monkeypatch.setattr(StepGraphs, 'unsupported', lambda *args: None)
    results = []
    for through_graphs in (True, False):
        model = _detector(warmup_iters=2, min_gt_capacity=8)
        wrapper = _wrapper(model, guarded=guarded)
        logs = []
        for step in range(2):
            data = _batch(num_boxes=(3, 2), seed=step)
            torch.manual_seed(10 + step)
            if through_graphs:
                logs.append(model.train_step(data, wrapper))
                assert model.step_graphs.warming_up and not len(model.step_graphs)
                continue
            data = model.data_preprocessor(data, True)
            padded = [_padded_sample(s, (8, 32)) for s in data['data_samples']]
            assert all(len(s.gt_instances) == 8 for s in padded)
            _start_momentum(wrapper.optimizer)
            lrs = [torch.tensor(g['lr'], dtype=torch.float32) for g in wrapper.optimizer.param_groups]
            with _device_lr(wrapper.optimizer, lrs):
                names, values, norm_key, flagged = step_body(model, data['inputs'], padded, wrapper)
            logs.append(dict(zip(names + [norm_key], values[:len(names) + 1])))
        results.append((logs, [p.detach().clone() for p in model.parameters()]))
    (logs, params), (ref_logs, ref_params) = results
    for log, ref_log in zip(logs, ref_logs):
        assert log.keys() == ref_log.keys() - {'train/grad_norm'}
        for key in log:
            torch.testing.assert_close(log[key], ref_log[key], rtol=0, atol=0)
    for ours, ref in zip(params, ref_params):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert any(not torch.equal(p, q) for p, q in zip(params, tiny_detector().parameters()))


def test_the_distributed_step_body_is_the_step_body(gloo_world_of_one):
    """step_body with DistributedStep (the parameters as aliases, the gradients set from an
    all-reduce) gives the plain step body's log values and parameters (one process: the
    average is the process's own gradient; two processes: test_distributed_step.py), on the
    CPU, where both are deterministic; the captured NCCL step on a GPU:
    test_captured_ddp_steps_give_the_eager_ddp_parameters."""
    from redet_plugin.cuda_graphs.distributed_step import DistributedStep
    from redet_plugin.cuda_graphs.step_graphs import step_body
    results = []
    for distributed in (None, DistributedStep()):
        model = _detector()
        model.step_graphs = None
        wrapper = _wrapper(model, guarded=True)
        for step in range(2):
            data = _padded_batch(seed=step)
            data = model.data_preprocessor(data, True)
            torch.manual_seed(10 + step)
            names, values, _, _ = step_body(model, data['inputs'], data['data_samples'],
                                            wrapper, distributed)
        results.append((dict(zip(names, values)), [p.detach().clone() for p in model.parameters()]))
    (ref_log, ref_params), (log, params) = results
    for key in ref_log:
        torch.testing.assert_close(log[key], ref_log[key], rtol=1e-5, atol=1e-6)
    for ref, ours in zip(ref_params, params):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(params, tiny_detector().parameters()))


# ---- on the GPU ---------------------------------------------------------------------------------
def _steps(captured, num_steps, batches, lrs=None, optimizer='SGD', amp=False,
           skip_first=False, ddp=False):
    """(model, log values, wrapper) after `num_steps` steps of the tiny detector: with
    cuda_graph_step (1 eager warm-up step, then captured ones), or eagerly on gts padded as the
    graph pads them, so that both draw the same random numbers. skip_first (AMP): the first
    step's loss scale is infinite, so the scaler skips it; then the scale is 1024. ddp: trained
    through RedetDistributedDataParallel (a process group must be up)."""
    from redet_plugin.engine import DistributedDataParallel
    from redet_plugin.structures.gt_padding import pad_gt_instances
    model = _detector('cuda', warmup_iters=1, min_gt_capacity=16)
    if not captured:
        model.step_graphs = None
    trained = (DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                       broadcast_buffers=False) if ddp else model)
    wrapper = _wrapper(model, optimizer, amp, **(
        dict(loss_scale=dict(init_scale=float('inf'))) if skip_first else {}))
    logs = []
    for step in range(num_steps):
        data = copy.deepcopy(batches[step % len(batches)])
        # (the captured run's warm-up step pads them too; through DDP it is the eager step)
        if not captured and (step > 0 or not ddp):
            for sample in data['data_samples']:
                sample.gt_instances = pad_gt_instances(sample.gt_instances, 16)
        if lrs is not None:
            for group in wrapper.optimizer.param_groups:
                group['lr'] = lrs[step]
        torch.cuda.manual_seed(100 + step)
        logs.append(trained.train_step(data, wrapper))
        if skip_first and step == 0:
            # skipped: no momentum buffers, or (the warm-up step) zeros
            assert all(not b.any() for s in wrapper.optimizer.state.values()
                       for b in s.values()) if captured else not wrapper.optimizer.state
            wrapper.loss_scaler.update(1024.0)
    if captured:
        assert model.step_graphs.failed is None, model.step_graphs.failed
    return model, logs, wrapper


def _update_gaps(ours, ref, start):
    """Per float tensor of the state dicts: |ours - ref| / |ref - start|, the distance of two
    runs' results relative to how far the reference moved (norms over the tensor). Elementwise
    closeness is too strict a test: Adam moves a weight by about lr whatever the size of its
    gradient, so an element whose gradient is only rounding noise moves either way."""
    gaps = {}
    for name, r in ref.items():
        if not r.is_floating_point():
            assert torch.equal(ours[name], r), name
            continue
        moved = (r.double() - start[name].double()).norm().item()
        gap = (ours[name].double() - r.double()).norm().item()
        gaps[name] = gap / moved if moved > 0 else (0.0 if gap == 0 else float('inf'))
    return gaps


# fp16 rounds the kernels a capture picks further apart from eager's than fp32 does
AMP_UPDATE_GAP = 1e-2


def _model_gap(ours, ref, start):
    """|ours - ref| / |ref - start| over every float tensor of the state dicts together."""
    gap = moved = 0.0
    for name, r in ref.items():
        if r.is_floating_point():
            gap += (ours[name].double() - r.double()).norm().item() ** 2
            moved += (r.double() - start[name].double()).norm().item() ** 2
    return (gap / moved) ** 0.5


def _assert_like_eager(graphed, eager, eager_again, start, floor):
    """Every tensor of `graphed` is as close to `eager` as a second eager run is (times 10), or
    within `floor` of the update: eager steps differ from run to run (atomic adds), and the
    graph's kernels (fused optimizer, those cuDNN picks under capture) round differently."""
    noise = _update_gaps(eager_again, eager, start)
    gaps = _update_gaps(graphed, eager, start)
    far = {name: (f'{gap:.2e}', f'{noise[name]:.2e}') for name, gap in gaps.items()
           if gap > max(floor, 10 * noise[name])}
    assert not far, f'(captured, second eager run) relative to the update: {far}'


@pytest.mark.cuda
@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
def test_captured_steps_give_the_eager_parameters(optimizer, log_lines):
    batches = [_batch('cuda', (3, 5), seed=0), _batch('cuda', (7, 1), seed=1)]
    lrs = [0.01, 0.01, 0.005, 0.02]  # a schedule: each replay reads the group's lr
    if optimizer == 'AdamW':
        lrs = [lr / 10 for lr in lrs]
    with full_fp32():  # (a capture may pick other cuDNN kernels: TF32 would round them apart)
        runs = [_steps(captured, 4, batches, lrs, optimizer) for captured in (False, False, True)]
    (eager, eager_logs, _), (eager_again, _, _), (graphed, graphed_logs, _) = runs
    assert len(graphed.step_graphs) == 1
    assert any('captured a training step' in line for line in log_lines())
    for ref, ours in zip(eager_logs, graphed_logs):
        assert ref.keys() == ours.keys()
        for key in ref:
            torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-5)
    start = tiny_detector('cuda').state_dict()
    # The captured cuDNN kernels round apart from the eager ones, and AdamW moves an element
    # whose gradient is only rounding noise by about lr either way: measured up to 7.9e-3 of a
    # tensor's update with SGD (batch-norm biases; the eager runs agree to 3e-6) and 5.4e-3 with
    # AdamW, where a stale lr or buffer moves it by ~1
    _assert_like_eager(graphed.state_dict(), eager.state_dict(), eager_again.state_dict(),
                       start, floor=2e-2)
    # the steps changed the parameters (a comparison of untouched models proves nothing)
    assert any(not torch.equal(start[k], v) for k, v in graphed.state_dict().items())


@pytest.mark.cuda
def test_captured_ddp_steps_give_the_eager_ddp_parameters(nccl_world_of_one, log_lines):
    """Through RedetDistributedDataParallel (NCCL, one process): the step is captured with its
    gradient all-reduce and gives the parameters of mmengine's eager DDP step."""
    batches = [_batch('cuda', (3, 5), seed=0), _batch('cuda', (7, 1), seed=1)]
    lrs = [0.01, 0.01, 0.005, 0.02]
    with full_fp32():
        runs = [_steps(captured, 4, batches, lrs, ddp=True) for captured in (False, False, True)]
    (eager, eager_logs, _), (eager_again, _, _), (graphed, graphed_logs, _) = runs
    assert len(graphed.step_graphs) == 1
    assert any('captured a training step' in line for line in log_lines())
    for ref, ours in zip(eager_logs, graphed_logs):
        for key in ref:
            torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-5)
    start = tiny_detector('cuda').state_dict()
    _assert_like_eager(graphed.state_dict(), eager.state_dict(), eager_again.state_dict(),
                       start, floor=1e-3)
    assert any(not torch.equal(start[k], v) for k, v in graphed.state_dict().items())


@pytest.mark.cuda
def test_captured_amp_steps_give_the_eager_amp_steps():
    """AmpOptimWrapper (fp16 autocast, dynamic loss scale) with SGD: the graph runs the scaler's
    unscale, inf check, fused step and scale update on the device."""
    batches = [_batch('cuda', (3, 5), seed=0), _batch('cuda', (7, 1), seed=1)]
    (eager, eager_logs, eager_wrapper), (eager_again, _, _), (graphed, graphed_logs, wrapper) = [
        _steps(captured, 4, batches, amp=True) for captured in (False, False, True)]
    assert len(graphed.step_graphs) == 1
    torch.testing.assert_close(wrapper.loss_scaler.get_scale(),
                               eager_wrapper.loss_scaler.get_scale())
    for ref, ours in zip(eager_logs, graphed_logs):
        for key in ref:
            torch.testing.assert_close(ours[key], ref[key], rtol=1e-3, atol=1e-3)
    _assert_like_eager(graphed.state_dict(), eager.state_dict(), eager_again.state_dict(),
                       tiny_detector('cuda').state_dict(), floor=AMP_UPDATE_GAP)


@pytest.mark.cuda
def test_captured_amp_steps_after_a_skipped_warm_up_give_the_eager_amp_steps():
    """The warm-up step overflows (an infinite loss scale) and the scaler skips it, so no step
    has made SGD's momentum buffers when the graph is captured: the replays must still apply
    momentum, as the eager steps do from their first applied step."""
    batches = [_batch('cuda', (3, 5), seed=0), _batch('cuda', (7, 1), seed=1)]
    (eager, eager_logs, eager_wrapper), (graphed, graphed_logs, wrapper) = [
        _steps(captured, 4, batches, amp=True, skip_first=True) for captured in (False, True)]
    assert len(graphed.step_graphs) == 1
    torch.testing.assert_close(wrapper.loss_scaler.get_scale(),
                               eager_wrapper.loss_scaler.get_scale())
    # (from the third step on, the order of the steps' atomic sums moves the fp16 losses: two
    # eager runs differ by up to 6e-4 at the fourth, the captured run by up to 2e-3, in either
    # layout)
    for ref, ours in zip(eager_logs[1:], graphed_logs[1:]):
        for key in ref:
            torch.testing.assert_close(ours[key], ref[key], rtol=1e-2, atol=1e-2)
    start = tiny_detector('cuda').state_dict()
    assert all(torch.isfinite(v).all() for v in graphed.state_dict().values())
    # Without momentum in the replays every tensor, and the model as a whole, would be about
    # half its update away (3 applied steps, momentum 0.9: 2.61 of 5.61 gradients). fp16 rounding
    # grows over the steps in small tensors that barely move: batch-norm weights of the deep
    # layers ended up to 0.11 of their update apart on an H200 while a second eager run stayed
    # within 0.01, so each tensor is held to a quarter and the model to a twentieth.
    gaps = _update_gaps(graphed.state_dict(), eager.state_dict(), start)
    assert max(gaps.values()) < 0.25, max(gaps.items(), key=lambda item: item[1])
    assert _model_gap(graphed.state_dict(), eager.state_dict(), start) < 0.05
    assert any(not torch.equal(start[k], v) for k, v in graphed.state_dict().items())


@pytest.mark.cuda
def test_a_replayed_step_waits_for_nothing():
    model = _detector('cuda', warmup_iters=1)
    wrapper = _wrapper(model)
    _captured(model, wrapper)
    data = _batch('cuda', (4, 2), seed=5)
    hub = MessageHub.get_current_instance()
    attach_queue(hub)  # as RedetRuntimeInfoHook does: the gradient norm waits unread
    try:
        with waits_for_nothing():
            log_vars = model.train_step(data, wrapper)
    finally:
        detach_queue(hub)
    assert all(torch.isfinite(v) for v in log_vars.values())


@pytest.mark.cuda
def test_more_gts_than_capacity_capture_again_or_run_eagerly(log_lines):
    model = _detector('cuda', warmup_iters=1, min_gt_capacity=4, max_graphs=1)
    wrapper = _wrapper(model)
    _captured(model, wrapper, (3, 1))
    model.train_step(_batch('cuda', (9, 1), seed=3), wrapper)  # capacity 16: a second layout
    assert len(model.step_graphs) == 1
    assert any('more than max_graphs=1' in line for line in log_lines())


def _pool_bytes(pool):
    return sum(segment['total_size'] for segment in torch.cuda.memory._snapshot()['segments']
               if tuple(segment.get('segment_pool_id', ())) == tuple(pool))


@pytest.mark.cuda
def test_a_second_gt_capacity_is_captured_without_warm_up_and_shares_the_pool(log_lines):
    model = _detector('cuda', warmup_iters=1, min_gt_capacity=4, max_graphs=2)
    wrapper = _wrapper(model)
    _captured(model, wrapper, (3, 1))
    first = _pool_bytes(model.step_graphs._pool)
    model.train_step(_batch('cuda', (9, 1), seed=3), wrapper)  # capacity 16
    assert len(model.step_graphs) == 2
    assert any('up to 16 gts' in line for line in log_lines())
    # the second graph reuses the memory the first one frees between replays (a graph of its
    # own memory would double the pool)
    assert 0 < first and _pool_bytes(model.step_graphs._pool) < 1.5 * first


@pytest.mark.cuda
def test_a_replaced_optimizer_state_is_captured_again():
    model = _detector('cuda', warmup_iters=1)
    wrapper = _wrapper(model)
    _captured(model, wrapper)
    old_graph = next(iter(model.step_graphs._graphs.values()))[1]
    wrapper.optimizer.load_state_dict(copy.deepcopy(wrapper.optimizer.state_dict()))
    model.train_step(_batch('cuda', seed=4), wrapper)
    assert next(iter(model.step_graphs._graphs.values()))[1] is not old_graph


@pytest.mark.cuda
def test_a_failed_capture_runs_eagerly_and_leaves_random_numbers_working(log_lines):
    model = _detector('cuda', warmup_iters=1)
    def read_back(module, args, outputs):  # legal eagerly, impossible inside a capture
        float(outputs[0][0].sum())

    model.rpn_head.register_forward_hook(read_back)
    wrapper = _wrapper(model)
    for seed in range(3):
        log_vars = model.train_step(_batch('cuda', seed=seed), wrapper)
    assert len(model.step_graphs) == 0
    assert model.step_graphs.failed.startswith('the capture failed')
    assert any('eager: the capture failed' in line for line in log_lines())
    assert all(torch.isfinite(v) for v in log_vars.values())
    torch.rand(4, device='cuda')  # the default generator is not left capturing


def test_the_walk_lists_the_eval_filters_that_graphs_read_in_place():
    """ModuleWalk's storage key covers every parameter, buffer and cached eval-mode filter
    (CachedFilterR2Conv): a graph reads all of them in place."""
    from redet_plugin.cuda_graphs.module_walk import ModuleWalk
    from redet_plugin.models.layers.equivariant import CachedFilterR2Conv
    model = tiny_detector().eval()
    convs = [m for m in model.modules() if isinstance(m, CachedFilterR2Conv)]
    model.extract_feat(torch.zeros(1, 3, 64, 64))  # (eval mode expands the filters once)
    filters = [t for conv in convs for t in conv.cached_tensors()]
    assert convs and filters
    walk = ModuleWalk(model)
    listed = {id(t) for t in walk.buffers}
    assert all(id(t) in listed for t in filters)
    assert len(walk.params) == len(list(model.parameters()))
    assert len(walk.buffers) == len(list(model.buffers())) + len(filters)
