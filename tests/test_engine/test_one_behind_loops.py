"""RedetValLoop / RedetTestLoop: each batch's results are read back only after the next batch's
forward is launched, and the metrics, outputs and hook arguments are mmengine's loops'."""
import os.path as osp
import uuid

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.engine import OneBatchBehind
from redet_plugin.structures.padded_results import keeping_padding

from ._read_guard import ReadGuard, reads_allowed

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')


def _padded_sample(count: int, capacity: int = 4):
    from mmdet.structures import DetDataSample
    valid = (torch.arange(capacity) < count).as_subclass(ReadGuard)
    sample = DetDataSample()
    sample.pred_instances = InstanceData(scores=torch.arange(capacity, 0, -1).float(), valid=valid)
    return sample


def test_a_batch_is_read_back_after_the_next_batch_is_launched():
    events = []

    def run_step(batch):
        assert keeping_padding()  # (the model returns fixed-size results inside the step)
        events.append(('step', batch))
        return [_padded_sample(count=batch)]

    def finish(idx, batch, outputs):
        pred = outputs[0].pred_instances
        assert 'valid' not in pred and len(pred) == batch == idx
        events.append(('finish', batch))

    behind = OneBatchBehind(finish)
    with reads_allowed(False):  # any read of `valid` in a step raises
        behind.step(0, 0, run_step)
    with reads_allowed():
        for idx in (1, 2, 3):
            behind.step(idx, idx, run_step)
        behind.flush()
    assert events == [('step', 0), ('step', 1), ('finish', 0), ('step', 2), ('finish', 1),
                      ('step', 3), ('finish', 2), ('finish', 3)]
    behind.flush()  # (nothing left: no second finish)
    assert len(events) == 8


@pytest.mark.cuda
def test_on_a_gpu_a_batch_is_read_without_waiting_for_the_next():
    """Batches 1 and 2 keep the GPU busy for about 1 s each: the batch before each must be cut
    and read while it still runs (on the step's stream the reads would wait for it). The long
    steps leave room for a GPU shared with other processes, which slows the reads. A first pass
    with short steps loads the read's kernels: CUDA loads a kernel's module at its first launch
    (lazy loading), which can wait for the kernels running then, as in a process's first batch."""
    from mmdet.structures import DetDataSample
    ends, seen = {}, []
    cycles = {}

    def run_step(batch):
        torch.cuda._sleep(cycles[batch])  # (GPU clock cycles)
        sample = DetDataSample()
        sample.pred_instances = InstanceData(scores=torch.ones(4, device='cuda'),
                                             valid=torch.arange(4, device='cuda') <= batch)
        ends[batch] = torch.cuda.Event()
        ends[batch].record()
        return [sample]

    def finish(idx, batch, outputs):
        scores = outputs[0].pred_instances.scores.cpu()  # (a metric's read)
        later = ends.get(batch + 1)
        seen.append((len(scores), ends[batch].query(), None if later is None else later.query()))

    def run_three_batches(batch_cycles):
        cycles.update(enumerate(batch_cycles))
        ends.clear()
        seen.clear()
        behind = OneBatchBehind(finish)
        for idx in range(3):
            behind.step(idx, idx, run_step)
        behind.flush()
        torch.cuda.synchronize()

    run_three_batches([1000, 1000, 1000])
    run_three_batches([100_000_000, 2_000_000_000, 2_000_000_000])
    assert seen == [(1, True, False), (2, True, False), (3, True, None)]


class _Recorder(Hook):
    def __init__(self):
        self.events, self.outputs = [], []

    def _before(self, runner, batch_idx, data_batch=None):
        self.events.append(('before', batch_idx))

    def _after(self, runner, batch_idx, data_batch=None, outputs=None):
        self.events.append(('after', batch_idx))
        self.outputs.append([(d.img_path, d.pred_instances) for d in outputs])

    before_val_iter = before_test_iter = _before
    after_val_iter = after_test_iter = _after


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    """The tiny config's Runner on 3 synthetic images, one per batch (random weights)."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    base = tmp_path_factory.mktemp('loops')
    cfg = Config.fromfile(TINY)
    for key in ('val_dataloader', 'test_dataloader'):
        cfg[key].update(batch_size=1, num_workers=0, persistent_workers=False)
        cfg[key].dataset.update(data_root=f'{base}/data/')
        cfg[key].dataset.synthetic.update(num_train=2, num_val=3, image_size=96)
    cfg.update(work_dir=str(base / 'work'), visualizer=dict(
        cfg.visualizer, name=f'loops-{uuid.uuid4().hex}'))
    # random weights make up to 100 detections an image, of several classes
    cfg.model.test_cfg.rcnn.score_thr = 0.0
    runner = Runner.from_cfg(cfg)
    runner.call_hook('before_run')  # (as Runner.val and Runner.test do)
    yield runner
    runner.call_hook('after_run')


@pytest.mark.parametrize('mode', ['val', 'test'])
def test_the_loops_give_mmengines_metrics_outputs_and_hook_calls(runner, mode):
    build = getattr(runner, f'build_{mode}_loop')
    runs = {}
    for loop_type in ('RedetValLoop' if mode == 'val' else 'RedetTestLoop',
                      'ValLoop' if mode == 'val' else 'TestLoop'):
        recorder = _Recorder()
        runner.register_hook(recorder, priority='LOWEST')
        try:
            metrics = build(dict(type=loop_type)).run()
        finally:
            runner._hooks.remove(recorder)
        runs[loop_type] = metrics, recorder
    (ours, ours_hooks), (theirs, their_hooks) = runs.values()
    assert ours == theirs and any(key.endswith('mAP') for key in ours), (ours, theirs)
    assert sorted(ours_hooks.events) == sorted(their_hooks.events) == sorted(
        [('before', i) for i in range(3)] + [('after', i) for i in range(3)])
    # one batch behind: batch i's after_iter comes after batch i+1's before_iter
    assert ours_hooks.events == [('before', 0), ('before', 1), ('after', 0), ('before', 2),
                                 ('after', 1), ('after', 2)]
    assert sum(len(pred) for (_, pred), in their_hooks.outputs) > 0
    for (ours_path, ours_pred), in_theirs in zip(
            [o for o, in ours_hooks.outputs], [o for o, in their_hooks.outputs]):
        their_path, their_pred = in_theirs
        assert ours_path == their_path
        assert set(ours_pred.keys()) == set(their_pred.keys()) and 'valid' not in ours_pred
        for key in their_pred.keys():
            torch.testing.assert_close(ours_pred[key], their_pred[key], rtol=0, atol=0)


def test_the_configs_use_the_loops():
    from mmengine.config import Config
    cfg = Config.fromfile(TINY)
    assert (cfg.val_cfg.type, cfg.test_cfg.type) == ('RedetValLoop', 'RedetTestLoop')
    schedule = Config.fromfile(osp.join(ROOT, 'configs/_base_/schedules/schedule_1x.py'))
    assert (schedule.val_cfg.type, schedule.test_cfg.type) == ('RedetValLoop', 'RedetTestLoop')
