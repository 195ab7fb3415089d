"""Where the detector's time goes: one training iteration (batch 2) and one inference image of the
R50 ReDet config on 1024^2 synthetic images, split by part.

Each part is timed by wrapping the method that does it (backbone and neck forward, RPN head /
loss / proposals, per RoI stage the assigner, sampler, RoI extractor, head, loss and refinement,
the NMS calls, the optimizer step) with a CUDA synchronisation before and after, and a
torch.profiler record_function range of the same name. The backward is split into heads / neck /
backbone by handing the neck and the heads detached copies of their inputs and backpropagating
the pieces one after the other. The synchronisations add a little to every part; the
uninstrumented time of the same step (model.train_step / test_step, the steps run back to back
with one synchronisation at the end, as a Runner runs them; test steps as RedetTestLoop runs them,
each batch's detections cut after the next batch is launched) is reported beside the sum, and with
CUDA the share of it the GPU spends in kernels (gpu_busy).
Data loading is the time one process takes to load and augment a batch (num_workers=0; in
training the loader's workers do this beside the GPU). The medians over --iters iterations /
--images images follow --warmup unmeasured ones. With CUDA the longest kernels of an
uninstrumented step come from torch.profiler, and the ops whose kernels take longest from an
eager step (eager_ops: by op, and by op and input shapes). Inference is most telling with
trained weights (--checkpoint): an untrained head scores every class near 1/16 and the NMS sees
thousands of boxes.
The RPN's assigner and sampler are timed as parts of 'rpn loss'.

    python -m benchmarks.profiling.profile_detector --out profile.json [--checkpoint CKPT] [--amp]
(from the repository root)
"""
import argparse
import contextlib
import functools
import json
import os.path as osp
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import record_function

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file')
    p.add_argument('--config',
                   default=osp.join(REPO,
                                    'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--data-root', default=osp.join(REPO, 'data', 'synthetic_dota_1024'),
                   help='DOTA-format folder with train/ and val/ '
                   '(tools/dataset_converters/make_synthetic_dota.py)')
    p.add_argument('--checkpoint', help='trained weights (else random: see the note above)')
    p.add_argument('--resize', type=int, help="Resize scale (default: the config's 1024)")
    p.add_argument('--amp', action='store_true', help='forward under fp16 autocast')
    p.add_argument('--eager', action='store_true',
                   help='no CUDA graphs (model.cuda_graphs=False; else the config\'s) for the '
                        'uninstrumented steps; the per-part table is always eager (the parts '
                        'cannot be timed inside a graph)')
    p.add_argument('--captured', action='store_true',
                   help='the uninstrumented steps as whole CUDA graphs (model.cuda_graph_step '
                        'with every batch padded to 256 gts, so that one graph serves all, and '
                        'model.cuda_graph_predict); the per-part table is always eager')
    p.add_argument('--channels-last', action=argparse.BooleanOptionalAction,
                   help="model.channels_last (default: the config's)")
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--iters', type=int, default=5, help='measured training iterations')
    p.add_argument('--images', type=int, default=10, help='measured inference images')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = p.parse_args(argv)
    for name in ('warmup', 'iters', 'images'):
        if getattr(args, name) < (0 if name == 'warmup' else 1):
            p.error(f'--{name}: got {getattr(args, name)}')
    if args.checkpoint and not osp.isfile(args.checkpoint):
        p.error(f'--checkpoint: {args.checkpoint!r} does not exist')
    if not osp.isdir(osp.join(args.data_root, 'train')):
        p.error(f'--data-root: {args.data_root!r} has no train/ (make it with '
                'python tools/dataset_converters/make_synthetic_dota.py DIR --image-size 1024)')
    return args


# ---- timing -------------------------------------------------------------------------------------
class PartTimer:
    """Sums the wall time of named parts within one step; keeps every step's sums."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == 'cuda'
        self.steps = []
        self.current = None
        self._restore = []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def begin(self):
        self.current = defaultdict(float)

    def end(self):
        self.steps.append(dict(self.current))
        self.current = None

    def call(self, label, fn, *args, **kwargs):
        """label: a string, or a function giving it at call time (a part shared by stages)."""
        label = label() if callable(label) else label
        self.sync()
        start = time.perf_counter()
        with record_function(label):
            out = fn(*args, **kwargs)
        self.sync()
        if self.current is not None:
            self.current[label] += time.perf_counter() - start
        return out

    def wrap(self, owner, attr, label):
        """Times owner.attr(...) as `label` until restore(); a missing attribute is skipped."""
        original = getattr(owner, attr, None)
        if original is None:
            return False
        own = attr in vars(owner)  # (a module's function) vs a method of the owner's class
        setattr(owner, attr, functools.wraps(original)(
            lambda *a, **k: self.call(label, original, *a, **k)))
        self._restore.append((owner, attr, own, original))
        return True

    def restore(self):
        """Undoes every wrap (and whatever else was set on a wrapped instance attribute)."""
        for owner, attr, own, original in reversed(self._restore):
            if own:
                setattr(owner, attr, original)
            elif attr in vars(owner):
                delattr(owner, attr)  # the class's method shows again
        self._restore = []

    def medians_ms(self):
        labels = {label for step in self.steps for label in step}
        return {label: 1000 * statistics.median(step.get(label, 0.0) for step in self.steps)
                for label in labels}


def _module_of(obj):
    return sys.modules[type(obj).__module__]


def instrument(model, timer, training):
    """Wraps the parts of the ReDet model; returns the labels in table order (label, parent)."""
    rows = [('backbone', None), ('neck', None)]
    timer.wrap(model.backbone, 'forward', 'backbone')
    timer.wrap(model.neck, 'forward', 'neck')
    rpn = model.rpn_head
    timer.wrap(rpn, 'forward', 'rpn head')
    rows.append(('rpn head', None))
    if training:
        timer.wrap(rpn, 'loss_by_feat', 'rpn loss')
        rows.append(('rpn loss', None))
        if timer.wrap(getattr(rpn, 'assigner', None), 'assign', 'rpn assign'):
            rows.append(('rpn assign', 'rpn loss'))
        # mmdet's RPNHead samples through its sampler, ours draws masks (sample_masks)
        if timer.wrap(getattr(rpn, 'sampler', None), 'sample', 'rpn sample') \
                | timer.wrap(_module_of(rpn), 'sample_masks', 'rpn sample'):
            rows.append(('rpn sample', 'rpn loss'))
    timer.wrap(rpn, 'predict_by_feat', 'rpn proposals')
    rows.append(('rpn proposals', None))
    if timer.wrap(_module_of(rpn), 'batched_nms', 'rpn nms') \
            | timer.wrap(_module_of(rpn), 'nms_keep_mask', 'rpn nms'):
        rows.append(('rpn nms', 'rpn proposals'))
    roi = model.roi_head
    stage_label = lambda part: lambda: f's{roi.current_stage} {part}'  # noqa: E731
    # our RoI head's fixed-size training parts are module functions or methods shared by stages;
    # its sample_fixed assigns, then draws
    fixed_size = training and timer.wrap(_module_of(roi), 'sample_fixed',
                                         stage_label('assign + sample'))
    timer.wrap(roi, '_refined_priors', stage_label('refine'))
    for stage in range(roi.num_stages):
        s = f's{stage}'
        last = stage == roi.num_stages - 1
        parts = []
        if training:
            timer.wrap(roi.bbox_assigner[stage], 'assign', f'{s} assign')
            if fixed_size:
                rows += [(f'{s} assign + sample', None), (f'{s} assign', f'{s} assign + sample')]
            else:
                timer.wrap(roi.bbox_sampler[stage], 'sample', f'{s} sample')
                parts += [f'{s} assign', f'{s} sample']
        timer.wrap(roi.bbox_roi_extractor[stage], 'forward', f'{s} RoI extractor')
        timer.wrap(roi.bbox_head[stage], 'forward', f'{s} head')
        parts += [f'{s} RoI extractor', f'{s} head']
        if training:
            for method in ('loss_and_target', 'fixed_size_targets', 'fixed_size_loss'):
                timer.wrap(roi.bbox_head[stage], method, f'{s} loss')
            parts.append(f'{s} loss')
        if not last:
            if training:
                timer.wrap(roi.bbox_head[stage], 'refine_bboxes', f'{s} refine')
            else:
                timer.wrap(roi.bbox_head[stage], 'regress_by_class', f'{s} refine')
            parts.append(f'{s} refine')
        rows += [(part, None) for part in parts]
    if not training:
        head = roi.bbox_head[-1]
        timer.wrap(head, 'predict_by_feat', 'rcnn boxes + NMS')
        rows.append(('rcnn boxes + NMS', None))
        if timer.wrap(_module_of(head), 'multiclass_nms', 'rcnn NMS') \
                | timer.wrap(_module_of(head), 'multiclass_nms_fixed', 'rcnn NMS'):
            rows.append(('rcnn NMS', 'rcnn boxes + NMS'))
    return rows


class BackwardSplit:
    """Hands the neck and the heads detached inputs so the backward can be run piece by piece."""

    def __init__(self, model):
        self.pieces = {}  # name -> (graph outputs, detached leaves)
        for name in ('backbone', 'neck'):
            module = getattr(model, name)
            module.forward = self._detaching(name, module.forward)

    def _detaching(self, name, forward):
        def run(*args, **kwargs):
            outs = forward(*args, **kwargs)
            leaves = tuple(o.detach().requires_grad_() for o in outs)
            self.pieces[name] = (outs, leaves)
            return leaves
        return run

    def backward(self, name):
        outs, leaves = self.pieces.pop(name)
        pairs = [(o, leaf.grad) for o, leaf in zip(outs, leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


# ---- steps --------------------------------------------------------------------------------------
def instrumented_train_step(model, batch, optim_wrapper, timer, split):
    timer.begin()
    data = timer.call('preprocess', model.data_preprocessor, batch, True)
    with optim_wrapper.optim_context(model):  # (autocast under AmpOptimWrapper)
        losses = timer.call('forward', model.loss, data['inputs'], data['data_samples'])
    loss, _ = model.parse_losses(losses)
    timer.call('backward heads', optim_wrapper.backward, loss)  # (scaled under amp)
    timer.call('backward neck', split.backward, 'neck')
    timer.call('backward backbone', split.backward, 'backbone')
    timer.call('optimizer step', lambda: (optim_wrapper.step(), optim_wrapper.zero_grad()))
    timer.end()


def plain_train_step(model, batch, optim_wrapper):
    model.train_step(batch, optim_wrapper)


def test_context(args):
    return torch.autocast(torch.device(args.device).type, dtype=torch.float16, enabled=args.amp)


def instrumented_test_image(model, batch, timer, args):
    timer.begin()
    with torch.no_grad():
        data = timer.call('preprocess', model.data_preprocessor, batch, False)
        with test_context(args):
            timer.call('forward', model.predict, data['inputs'], data['data_samples'])
    timer.end()


def plain_test_image(model, batch, args):
    with torch.no_grad(), test_context(args):  # (as mmengine's test loop runs it)
        return model.test_step(batch)


def one_behind(model, args, finish=lambda idx, batch, outputs: None):
    """A test step as RedetTestLoop runs it, `step(batch)`, and `flush()`, which finishes the
    last; `finish` gets each batch's cut outputs."""
    from redet_plugin.engine import OneBatchBehind
    behind = OneBatchBehind(finish)  # (it cuts the outputs)
    return (lambda b: behind.step(0, b, lambda b: plain_test_image(model, b, args)),
            behind.flush)


def back_to_back_ms(fn, batches, timer):
    """ms per call of `fn` over `batches` run one after the other, with one synchronisation at
    the end: as a Runner runs its steps, the host may run ahead of the GPU, so this is the
    larger of the host's and the GPU's time per step."""
    timer.sync()
    start = time.perf_counter()
    for batch in batches:
        fn(batch)
    timer.sync()
    return 1000 * (time.perf_counter() - start) / len(batches)


# ---- set-up -------------------------------------------------------------------------------------
def build(args):
    from mmengine.config import Config
    from mmengine.logging import MMLogger
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner, load_checkpoint
    MMLogger.get_instance('profile_detector', log_level='WARNING')  # (no per-weight init log)
    cfg = Config.fromfile(args.config)
    if args.eager or args.captured:
        cfg.model.cuda_graph_features = False
    if args.eager:
        cfg.model.cuda_graph_step = cfg.model.cuda_graph_predict = False
    if args.captured:
        cfg.model.cuda_graph_step = dict(min_gt_capacity=256, warmup_iters=1)
        cfg.model.cuda_graph_predict = True
    if args.channels_last is not None:
        cfg.model.channels_last = args.channels_last
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint, map_location='cpu')
    model.to(args.device).train()
    if args.amp:
        cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic')
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    loaders = {}
    for key, split in (('train_dataloader', 'train'), ('test_dataloader', 'val')):
        loader_cfg = cfg[key].copy()
        loader_cfg.update(num_workers=0, persistent_workers=False)
        dataset = loader_cfg['dataset']
        dataset.update(data_root=osp.abspath(args.data_root) + '/', ann_file=f'{split}/labelTxt/',
                       data_prefix=dict(img_path=f'{split}/images/'))
        if args.resize:
            for step in dataset['pipeline']:
                if str(step.get('type', '')).split('.')[-1] == 'Resize':
                    step['scale'] = (args.resize, args.resize)
        loaders[split] = Runner.build_dataloader(loader_cfg)
    return cfg, model, optim_wrapper, loaders


def load_batches(loader, count):
    """`count` batches and the median time one took to load (this process alone)."""
    batches, times, it = [], [], iter(loader)
    for _ in range(count):
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        times.append(time.perf_counter() - start)
        batches.append(batch)
    return batches, 1000 * statistics.median(times)


@contextlib.contextmanager
def queued_logs():
    """Training steps within log their values as in a Runner with RedetRuntimeInfoHook: they
    wait on the device (no read-back per step)."""
    from mmengine.logging import MessageHub
    from redet_plugin.utils.deferred_scalars import attach_queue, detach_queue
    hub = MessageHub.get_current_instance()
    attach_queue(hub)
    try:
        yield
    finally:
        detach_queue(hub)


def _profiled(fn, calls, activities, **kwargs):
    """torch.profiler over `calls` calls of fn, after one unprofiled call."""
    from torch.profiler import profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=activities, **kwargs) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


def top_kernels(fn, calls=2, count=15):
    """Device ms per fn() call of its longest kernels (torch.profiler), names shortened."""
    from torch.profiler import ProfilerActivity
    prof = _profiled(fn, calls, [ProfilerActivity.CUDA])
    totals = defaultdict(float)
    for event in prof.key_averages():
        total = getattr(event, 'device_time_total', None) or getattr(event, 'cuda_time_total', 0)
        if total > 0:
            # (our kernels live in anonymous namespaces: "redet::(anonymous namespace)::k<...>")
            name = event.key.replace('void ', '').replace('(anonymous namespace)::', '')
            name = name.split('<')[0].split('(')[0].split('::')[-1]
            totals[name[:70]] += total / calls / 1000
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:count]
    from torch.autograd import DeviceType
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == DeviceType.CUDA]
    launch_gaps_ms, waits_ms = device_idle_ms(spans)
    return dict(total_kernel_ms=round(sum(totals.values()), 3),
                kernels_ms={name: round(ms, 3) for name, ms in ranked},
                kernels_per_call=round(len(spans) / calls),
                launch_gaps_ms=round(launch_gaps_ms / calls, 3),
                device_waits_ms=round(waits_ms / calls, 3))


def device_idle_ms(spans, launch_gap_us=20.0):
    """The device's idle time between its activities ((start, end) in us, any order), in ms:
    (gaps of at most launch_gap_us each, the latency between kernels launched back to back or
    replayed from a graph; longer gaps, the device waiting for the host)."""
    short = long = 0.0
    busy_until = None
    for start, end in sorted(spans):
        if busy_until is not None and start > busy_until:
            gap = start - busy_until
            if gap <= launch_gap_us:
                short += gap
            else:
                long += gap
        busy_until = end if busy_until is None else max(busy_until, end)
    return short / 1000, long / 1000


def top_ops(fn, calls=2, count=40):
    """Device ms per fn() call of the torch ops whose own kernels take longest, by op name and
    by op and input shapes (torch.profiler): which ops the longest kernels come from. Run on
    eager steps: a graph's replay has kernels but no ops."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    prof = _profiled(fn, calls, [ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True)

    def ranked(events, name):
        totals = defaultdict(float)
        for event in events:
            if event.device_type == DeviceType.CPU and event.self_device_time_total > 0:
                totals[name(event)] += event.self_device_time_total / calls / 1000
        return {key: round(ms, 3) for key, ms in sorted(totals.items(),
                                                         key=lambda kv: -kv[1])[:count]}
    # Elementwise kernels are many small shares of many ops: each op (with its shapes) is named
    # with its callers, so that a share can be traced to the layer or loss that launches it.
    elementwise = defaultdict(float)
    for event in prof.events():
        if event.device_type != DeviceType.CPU or not event.kernels:
            continue
        us = sum(k.duration for k in event.kernels if 'elementwise' in k.name)
        if us > 0:
            callers, parent = [], event.cpu_parent
            while parent is not None and len(callers) < 3:
                callers.append(parent.name)
                parent = parent.cpu_parent
            key = f'{event.name} {event.input_shapes} < ' + ' < '.join(callers)
            elementwise[key[:220]] += us / calls / 1000
    return dict(by_op=ranked(prof.key_averages(), lambda e: e.key),
                by_op_and_shapes=ranked(prof.key_averages(group_by_input_shape=True),
                                        lambda e: f'{e.key} {e.input_shapes}'[:160]),
                elementwise_by_op_and_callers={
                    key: round(ms, 3) for key, ms in sorted(elementwise.items(),
                                                            key=lambda kv: -kv[1])[:count]})


def innermost_range(points, ranges):
    """For each point (a time), the label of the shortest (label, start, end) range holding it,
    or 'other'. By time, not by parent op: the backward's ops run on autograd's own thread, outside
    the main thread's record_function ranges, while the main thread waits inside one."""
    labels = []
    for t in points:
        holding = [(end - start, label) for label, start, end in ranges if start <= t <= end]
        labels.append(min(holding)[1] if holding else 'other')
    return labels


def kernels_by_part(fn, labels, calls=1):
    """Kernel launches and kernel ms per fn() call (an instrumented step) by part: each op's
    kernels go to the innermost part range (record_function) its start falls in. A captured
    step replays its graph as a whole, so this runs the eager step: which parts launch the many
    small kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    prof = _profiled(fn, calls, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    events = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    ranges = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name in labels]
    launching = [e for e in events if e.kernels]
    counts, ms = defaultdict(int), defaultdict(float)
    for event, part in zip(launching, innermost_range([e.time_range.start for e in launching],
                                                      ranges)):
        counts[part] += len(event.kernels)
        ms[part] += sum(k.duration for k in event.kernels) / 1000
    return {part: dict(kernels=round(counts[part] / calls), ms=round(ms[part] / calls, 3))
            for part in sorted(counts, key=lambda p: -counts[p])}


# ---- report -------------------------------------------------------------------------------------
def summary(timer, rows, data_ms, plain_ms, last_rows=()):
    parts = timer.medians_ms()
    top = [label for label, parent in rows if parent is None]
    forward_other = parts.get('forward', 0.0) - sum(parts.get(label, 0.0) for label in top)
    table = [(label, parent, parts.get(label)) for label, parent in [('preprocess', None)] + rows]
    table.append(('forward, other', None, forward_other))
    table += [(label, None, parts.get(label)) for label in last_rows]
    return dict(parts_ms={label: round(ms, 3) for label, _, ms in table if ms is not None},
                rows=[[label, parent] for label, parent, _ in table],
                data_loading_ms=round(data_ms, 3),
                instrumented_total_ms=round(sum(parts.get(k, 0.0) for k in (
                    'preprocess', 'forward', 'backward heads', 'backward neck',
                    'backward backbone', 'optimizer step')), 3),
                uninstrumented_ms=round(plain_ms, 3))


def markdown(result):
    train, test = result['train'], result['test']
    order = [list(row) for row in train['rows']]
    for i, row in enumerate(test['rows']):  # inference-only rows go after their predecessor
        if row not in order:
            order.insert(order.index(test['rows'][i - 1]) + 1 if i else 0, row)
    lines = ['| part | training iteration (batch 2), ms | share '
             '| inference (1 image), ms | share |',
             '|---|---|---|---|---|']

    def cell(section, label):
        ms = section['parts_ms'].get(label)
        if ms is None:
            return ['', '']
        return [f'{ms:.1f}', f'{100 * ms / section["instrumented_total_ms"]:.0f}%']

    lines.append('| data loading (1 process) | ' + f"{train['data_loading_ms']:.1f} | | "
                 f"{test['data_loading_ms']:.1f} | |")
    for label, parent in order:
        name = f'&nbsp;&nbsp;{label} (in {parent})' if parent else label
        lines.append('| ' + ' | '.join([name] + cell(train, label) + cell(test, label)) + ' |')
    lines.append(f"| **sum of parts** | {train['instrumented_total_ms']:.1f} | | "
                 f"{test['instrumented_total_ms']:.1f} | |")
    lines.append(f"| **step, uninstrumented** | {train['uninstrumented_ms']:.1f} | | "
                 f"{test['uninstrumented_ms']:.1f} | |")
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    cfg, model, optim_wrapper, loaders = build(args)
    train_batches, train_data_ms = load_batches(loaders['train'], args.warmup + args.iters)
    test_batches, test_data_ms = load_batches(loaders['val'], args.warmup + args.images)
    cuda = torch.device(args.device).type == 'cuda'
    timer = PartTimer(args.device)

    # training: uninstrumented first, then instrumented
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with queued_logs():
        for batch in train_batches[:args.warmup]:
            plain_train_step(model, batch, optim_wrapper)
        train_plain = back_to_back_ms(lambda b: plain_train_step(model, b, optim_wrapper),
                                      train_batches[args.warmup:], timer)
        # (a CUDA graph's memory is reserved in its own pool and not counted as allocated
        # between replays: the reserved peak is the one to compare with the graphs)
        train_memory = dict(peak_allocated_mb=torch.cuda.max_memory_allocated() // 2**20,
                            peak_reserved_mb=torch.cuda.max_memory_reserved() // 2**20
                            ) if cuda else None
        train_kernels = top_kernels(
            lambda: plain_train_step(model, train_batches[-1], optim_wrapper)) if cuda else None
    graphs, model.feature_graphs = getattr(model, 'feature_graphs', None), None  # (eager parts)
    step_graphs, model.step_graphs = getattr(model, 'step_graphs', None), None
    train_ops = top_ops(
        lambda: plain_train_step(model, train_batches[-1], optim_wrapper)) if cuda else None
    rows = instrument(model, timer, training=True)
    split = BackwardSplit(model)
    for i, batch in enumerate(train_batches):
        instrumented_train_step(model, batch, optim_wrapper, timer, split)
        if i + 1 == args.warmup:
            timer.steps = []
    last_rows = ('backward heads', 'backward neck', 'backward backbone', 'optimizer step')
    timed_steps = list(timer.steps)
    train_kernels_by_part = kernels_by_part(
        lambda: instrumented_train_step(model, train_batches[-1], optim_wrapper, timer, split),
        set().union(*timed_steps)) if cuda else None  # (the labels the timed steps recorded)
    timer.steps = timed_steps  # (the profiled steps are not timed ones)
    timer.restore()  # (the BackwardSplit wrappers go with the timing ones)
    train = summary(timer, rows, train_data_ms, train_plain, last_rows)
    train['kernels_by_part'] = train_kernels_by_part

    # inference
    model.eval()
    model.feature_graphs, model.step_graphs = graphs, step_graphs
    timer = PartTimer(args.device)
    for batch in test_batches[:args.warmup]:
        plain_test_image(model, batch, args)
    test_step, finish_test = one_behind(model, args)
    test_plain = back_to_back_ms(test_step, test_batches[args.warmup:], timer)
    test_kernels = top_kernels(lambda: test_step(test_batches[-1])) if cuda else None
    finish_test()
    predict_graphs = getattr(model, 'predict_graphs', None)
    model.feature_graphs = model.predict_graphs = None
    test_ops = top_ops(lambda: plain_test_image(model, test_batches[-1], args)) if cuda else None
    rows = instrument(model, timer, training=False)
    for i, batch in enumerate(test_batches):
        instrumented_test_image(model, batch, timer, args)
        if i + 1 == args.warmup:
            timer.steps = []
    timer.restore()
    model.predict_graphs = predict_graphs
    test = summary(timer, rows, test_data_ms, test_plain)

    result = dict(
        what='ReDet R50 per-part time: one training iteration (batch 2) and one inference image '
             '(benchmarks/profiling/profile_detector.py)',
        command=' '.join(['python -m benchmarks.profiling.profile_detector']
                         + (argv if argv is not None else sys.argv[1:])),
        config=osp.relpath(args.config, REPO), checkpoint=args.checkpoint, amp=args.amp,
        eager=args.eager, graphs=graphs is not None, captured=args.captured,
        channels_last=model.channels_last,
        image_size=args.resize or 1024, device=torch.cuda.get_device_name() if cuda else 'cpu',
        torch=torch.__version__, warmup=args.warmup, iters=args.iters, images=args.images,
        train=train, test=test, kernels=dict(train=train_kernels, test=test_kernels),
        eager_ops=dict(train=train_ops, test=test_ops),
        train_memory=train_memory)
    if cuda:  # the share of the uninstrumented step's wall time the GPU runs kernels
        for section, kernels in ((train, train_kernels), (test, test_kernels)):
            section['gpu_busy'] = round(kernels['total_kernel_ms'] / section['uninstrumented_ms'],
                                        3)
    result['markdown'] = markdown(result)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(result['markdown'])
    for name, kernels in result['kernels'].items():
        if kernels:
            print(f"\nlongest kernels, {name} ({kernels['total_kernel_ms']:.1f} ms of "
                  f"{kernels['kernels_per_call']} kernels; the device idle "
                  f"{kernels['launch_gaps_ms']:.1f} ms between kernels launched back to back, "
                  f"{kernels['device_waits_ms']:.1f} ms waiting):")
            for kernel, ms in kernels['kernels_ms'].items():
                print(f'  {ms:8.3f} ms  {kernel}')
    for name, ops in result['eager_ops'].items():
        if ops:
            print(f"\nops whose own kernels take longest, eager {name} step:")
            for op, ms in ops['by_op'].items():
                print(f'  {ms:8.3f} ms  {op}')


if __name__ == '__main__':
    main()
