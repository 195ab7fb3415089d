"""A training killed with SIGKILL and resumed (`tools/train.py --resume`) ends with the weights of
the run that was never stopped, having trained on the same batches, with the same augmentations
and learning rates; also when killed while a checkpoint is written (to 1e-6, on the CPU and, with
the config's captured step, on a GPU)."""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

import redet_plugin.mm  # noqa: F401  (mmengine's objects in checkpoints, for torch.load)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
HELPER = osp.join(ROOT, 'tests/test_tools/_train_process.py')
ITERS, EVERY = 6, 2  # iterations, checkpoint interval

CONFIG = '''
_base_ = {tiny!r}
custom_imports = dict(imports=['redet_plugin.mm', 'tests.test_tools._resume_probe'],
                      allow_failed_imports=False)
synthetic = dict(num_train=6, num_val=2, image_size=128, seed=0)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='RedetRandomRotate90', prob=0.5),
    dict(type='PackDetInputs')]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(data_root={data!r}, synthetic=synthetic, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(data_root={data!r}, synthetic=synthetic))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={iters}, val_interval={every})
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end={iters}, milestones=[4], gamma=0.1)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval={every}, by_epoch=False, max_keep_ckpts=5))
custom_hooks = [dict(type='ResumeProbeHook')]
log_processor = dict(by_epoch=False)
randomness = dict(seed=0, deterministic=True)
'''


@pytest.fixture(scope='module')
def config(tmp_path_factory):
    base = tmp_path_factory.mktemp('resume')
    path = base / 'tiny_iters.py'
    path.write_text(CONFIG.format(tiny=TINY, data=str(base / 'data') + '/', iters=ITERS, every=EVERY))
    return str(path)


def _env(**extra):
    env = dict(os.environ, REDET_TEST_FLUSH_DENORMAL='1', **extra)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (ROOT, env.get('PYTHONPATH')) if p)
    return env


def _train(config, work_dir, *args, **env):
    """The run's log; on a GPU the run must have captured its step (the warm-up steps before a
    capture are what a resumed run repeats)."""
    done = subprocess.run([sys.executable, HELPER, config, '--work-dir', work_dir, *args],
                          cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    log = done.stdout + done.stderr
    if torch.cuda.is_available():
        assert 'cuda_graph_step: captured a training step' in log, log[-3000:]
    return log


def _start(config, work_dir, **env):
    log = open(osp.join(work_dir + '.log'), 'w')
    return subprocess.Popen([sys.executable, HELPER, config, '--work-dir', work_dir], cwd=ROOT,
                            env=_env(**env), stdout=log, stderr=subprocess.STDOUT)


def _wait_for(process, ready, what, timeout=180):
    end = time.time() + timeout
    while not ready():
        if process.poll() is not None:
            raise AssertionError(f'the training ended (code {process.returncode}) before {what}')
        if time.time() > end:
            process.kill()
            raise AssertionError(f'no {what} after {timeout} s')
        time.sleep(0.05)


def _probe(work_dir):
    path = osp.join(work_dir, 'probe.jsonl')
    if not osp.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith('\n')]


def _kill(process):
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


def _weights(path):
    return torch.load(path, map_location='cpu', weights_only=True)['state_dict']


def _assert_same_run(resumed_dir, reference_dir, from_iter):
    """The resumed process trained iterations from_iter+1 .. ITERS on the batches, augmentations
    and learning rates of the reference run, and ended with its weights."""
    reference = {r['iter']: r for r in _probe(reference_dir)}
    records = _probe(resumed_dir)
    resumed = [r for r in records if r['pid'] == records[-1]['pid']]
    assert [r['iter'] for r in resumed] == list(range(from_iter + 1, ITERS + 1))
    for record in records:
        theirs = reference[record['iter']]
        for key in ('img_ids', 'pixels', 'boxes', 'lr'):
            assert record[key] == theirs[key], (record['iter'], key, record[key], theirs[key])
    last = f'iter_{ITERS}.pth'
    ours, theirs = _weights(osp.join(resumed_dir, last)), _weights(osp.join(reference_dir, last))
    assert ours.keys() == theirs.keys()
    worst = max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in ours
                if ours[k].is_floating_point())
    assert worst <= 1e-6, worst


@pytest.fixture(scope='module')
def uninterrupted(config, tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp('uninterrupted') / 'work')
    _train(config, work_dir)
    records = _probe(work_dir)
    assert [r['iter'] for r in records] == list(range(1, ITERS + 1))
    lrs = [r['lr'] for r in records]  # the warm-up, then the step at iteration 4
    assert lrs[0] < lrs[1] < lrs[2] == lrs[3] and lrs[4] == pytest.approx(lrs[3] / 10)
    return work_dir


def test_killed_between_checkpoints_resumes_to_the_same_weights(config, uninterrupted, tmp_path):
    work_dir = str(tmp_path / 'work')
    os.makedirs(work_dir)
    process = _start(config, work_dir, REDET_TEST_PAUSE_AT=str(EVERY + 1))
    _wait_for(process, lambda: any(r['iter'] == EVERY + 1 for r in _probe(work_dir)),
              f'iteration {EVERY + 1}')
    _kill(process)  # after the checkpoint of iteration EVERY, before the next one
    assert sorted(f for f in os.listdir(work_dir) if f.endswith('.pth')) == [f'iter_{EVERY}.pth']
    log = _train(config, work_dir, '--resume')
    assert f'resumed at iteration {EVERY}: the data continue after batch {EVERY} of pass 1' in log
    _assert_same_run(work_dir, uninterrupted, EVERY)


@pytest.mark.parametrize('cut', [f'iter_{2 * EVERY}.pth', 'last_checkpoint'])
def test_killed_while_writing_a_checkpoint_resumes_from_a_whole_one(cut, config, uninterrupted,
                                                                    tmp_path):
    """Killed half-way through the second checkpoint (or through naming it in last_checkpoint):
    the resume takes the first, whole, checkpoint and ends as the uninterrupted run."""
    work_dir = str(tmp_path / 'work')
    os.makedirs(work_dir)
    process = _start(config, work_dir, REDET_TEST_SLOW_WRITE=f'{cut}:{1 if cut.endswith(".pth") else 2}:60')

    _wait_for(process, lambda: osp.exists(osp.join(work_dir, 'slow_write_started')),
              f'a half-written {cut}')
    _kill(process)
    part, = [f for f in os.listdir(work_dir) if f.startswith(f'.{cut}.') and f.endswith('.part')]
    assert osp.getsize(osp.join(work_dir, part)) > 0  # the write the kill cut
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        named = f.read().strip()
    assert osp.basename(named) == f'iter_{EVERY}.pth'  # never the checkpoint being written
    assert len(_weights(named))  # whole
    if cut.endswith('.pth'):
        assert not osp.exists(osp.join(work_dir, cut))
    log = _train(config, work_dir, '--resume')
    assert 'resumed at iteration' in log
    assert not [f for f in os.listdir(work_dir) if f.endswith('.part')]  # the cut write's file removed
    _assert_same_run(work_dir, uninterrupted, EVERY)
