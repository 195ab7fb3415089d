"""Training and testing in two processes (DDP over gloo, on the CPU) against one process, through
tools/train.py and tools/test.py with --launcher pytorch, as tools/dist_train.sh and
tools/dist_test.sh start them under torchrun.

Training: one optimizer step in two processes must give the gradients and parameters of one
process that is given both processes' images.
- Batch norm: the configs normalise with each process's batch statistics (the backbone's
  norm_eval is False, no sync_bn), so a process given both images at once normalises otherwise
  than two processes given one each. With those statistics the single process takes each
  process's batch in turn and accumulates (optim_wrapper.accumulative_counts=2: the loss halved,
  the gradients summed), which is what DDP's averaging claims to equal. With the norms frozen
  (norm_eval=True) the single process takes both images as one batch.
- The RPN and RoI samplers draw per image with keys seeded by the image's assignment
  (_distributed_probe.ImageSeededRandomSampler): otherwise the runs differ by where each process's
  RNG stream stands, not by anything DDP does.
- Constant learning rate: the accumulating process steps at its second iteration, when a
  per-iteration warm-up would have moved on.
Testing: every image is detected once (5 images on 2 processes: the sampler pads rank 1 with a
repeat of image 0, which the gathering must drop), with the single process's detections, in the
data set's order, and the same mAP.

The processes are spawned (a fork of this multi-threaded process can hang) and hide any GPU, so
the test runs the CPU path on every machine.
"""
import gc
import glob
import json
import multiprocessing
import os
import os.path as osp
import pickle
import sys

import pytest
import torch
import torch.distributed as dist

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets.synthetic import ensure_synthetic_dota
from tests._helpers import free_port

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
SIZE = 96
SYNTHETIC = dict(num_train=2, num_val=5, image_size=SIZE, seed=0)
PROCESS_TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason='needs torch.distributed with gloo')

CONFIG = """
_base_ = {tiny!r}
custom_imports = dict(imports=['redet_plugin.mm', 'tests.test_tools._distributed_probe'],
                      allow_failed_imports=False)
synthetic = {synthetic!r}
dataset_type = 'RedetSyntheticDOTADataset'
# no random flips or rotations: each process would draw them from its own RNG
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=({size}, {size}), keep_ratio=True),
    dict(type='PackDetInputs')]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=({size}, {size}), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
train_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(data_root={root!r}, synthetic=synthetic, pipeline=train_pipeline))
test_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root={root!r}, synthetic=synthetic,
                 ann_file='val/labelTxt/', data_prefix=dict(img_path='val/images/'),
                 test_mode=True, pipeline=test_pipeline))
test_evaluator = dict(type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')
val_dataloader = None
val_cfg = None
val_evaluator = None
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1)
param_scheduler = None
randomness = dict(seed=0)
# the config's nccl: the tools fall back to gloo without a GPU; a lost peer ends the run
env_cfg = dict(dist_cfg=dict(backend='nccl', timeout=120))
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=1, max_keep_ckpts=1))
custom_hooks = [dict(type='StepRecordHook')]
model = dict(
    train_cfg=dict(rpn=dict(sampler=dict(type='ImageSeededRandomSampler')),
                   rpn_proposal=dict(nms_pre=200, max_per_img=64)),
    test_cfg=dict(rpn=dict(nms_pre=200, max_per_img=64), rcnn=dict(max_per_img=50)))
"""
# (list entries cannot be merged from a config file, only from the command line)
FEWER_ROIS = [f'model.train_cfg.rcnn.{stage}.sampler.{key}={value}' for stage in (0, 1)
              for key, value in (('type', 'ImageSeededRandomSampler'), ('num', 32))]


@pytest.fixture(scope='module')
def config(tmp_path_factory):
    base = tmp_path_factory.mktemp('distributed')
    data_root = str(base / 'data') + '/'
    # made here once: a process that found another set would make its own, racing the others
    ensure_synthetic_dota(data_root, progress=False, **SYNTHETIC)
    path = base / 'tiny_distributed.py'
    path.write_text(CONFIG.format(tiny=TINY, synthetic=SYNTHETIC, size=SIZE, root=data_root))
    return str(path)



def _process(main, argv, rank, world_size, port):
    if world_size > 1:  # what torchrun gives each process
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR='127.0.0.1',
                          MASTER_PORT=str(port))
    # the CPU path, on a GPU machine too: mmengine decides its device once, at import
    import mmengine.device.utils
    torch.cuda.is_available = lambda: False
    mmengine.device.utils.DEVICE = 'cpu'
    dist.destroy_process_group = _destroy_without_wrappers(dist.destroy_process_group)
    main(argv)


def _destroy_without_wrappers(destroy):
    """destroy_process_group that fails where a DDP wrapper is still alive: it holds the group,
    which torch then tears down at exit, and that aborts now and then once a peer has exited."""
    def checked(*args, **kwargs):
        gc.collect()
        if any(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects()):
            raise AssertionError('a DistributedDataParallel wrapper outlives the run')
        destroy(*args, **kwargs)
    return checked


def run_tool(main, argv, world_size):
    """main(argv) in world_size processes started as torchrun starts them (--launcher pytorch),
    or in one plain process."""
    argv = argv + (['--launcher', 'pytorch'] if world_size > 1 else [])
    # Spawned, not forked: a fork copies a pytest process that earlier tests have left with
    # threads (torch's thread pools, autograd's device threads, CUDA), and a lock held by one of
    # them at the fork hangs the child (seen in a whole-suite run on the CPU).
    context, port = multiprocessing.get_context('spawn'), free_port()
    processes = [context.Process(target=_process, args=(main, argv, rank, world_size, port))
                 for rank in range(world_size)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(PROCESS_TIMEOUT_S)
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in processes]
    assert codes == [0] * world_size, f'{main.__module__} {argv}: exit codes {codes}'


def train(config, work_dir, world_size, *options, flags=()):
    """Trains through tools/train.py; returns each process's StepRecordHook record."""
    from tools.train import main
    run_tool(main, [config, '--work-dir', str(work_dir), *flags, '--cfg-options', *FEWER_ROIS,
                    *options], world_size)
    return [torch.load(osp.join(work_dir, f'rank{rank}.pt')) for rank in range(world_size)]


def assert_close_tensors(actual: dict, expected: dict, what: str, tolerance: float):
    """Each tensor within `tolerance` times the largest magnitude of the expected one."""
    assert actual.keys() == expected.keys(), what
    for name, value in expected.items():
        bound = tolerance * float(value.abs().max())
        torch.testing.assert_close(actual[name], value, rtol=0, atol=bound,
                                   msg=lambda m, name=name: f'{what} {name}: {m}')


ADAMW_EPS = 1e-8  # the tiny config's AdamW (torch's default)


def assert_same_first_adamw_update(update, expected, grads, expected_grads, what):
    """AdamW's first step moves each element by lr * g / (|g| + eps) (plus the same weight
    decay): by about lr wherever |g| >> eps, but where |g| is near eps by an amount that the
    gradient's last bits decide (its derivative is lr * eps / (|g| + eps)^2). So each element may
    differ by 1e-2 lr, plus twice what its own gradient difference explains through that
    derivative; lr is the largest expected update."""
    for name, value in expected.items():
        lr = float(value.abs().max())
        g, dg = expected_grads[name], (grads[name] - expected_grads[name]).abs()
        allowed = 1e-2 * lr + 2 * lr * ADAMW_EPS * dg / (g.abs() + ADAMW_EPS) ** 2
        excess = (update[name] - value).abs() - allowed
        worst = int(excess.flatten().argmax()) if excess.numel() else 0
        assert excess.numel() == 0 or float(excess.flatten()[worst]) <= 0, (
            f'{what} {name}: element {worst} is {float(update[name].flatten()[worst])}, expected '
            f'{float(value.flatten()[worst])} (gradient {float(g.flatten()[worst])}, allowed '
            f'difference {float(allowed.flatten()[worst])})')


def assert_same_step(ddp, single):
    """Both DDP processes started from the single process's parameters, stepped with its
    gradients (DDP's average) and moved its parameters as it did."""
    reference = single[0]
    assert reference['steps'] == 1 and reference['grads']
    ref_update = {n: p - reference['before'][n] for n, p in reference['after'].items()}
    for rank, record in enumerate(ddp):
        assert record['world_size'] == 2 and record['steps'] == 1
        assert_close_tensors(record['before'], reference['before'], f'rank {rank} initial', 0)
        # float32 sums in other orders, nothing more: a gradient left out, counted twice or of
        # other samples is off by far more
        assert_close_tensors(record['grads'], reference['grads'], f'rank {rank} gradient', 1e-4)
        update = {n: p - record['before'][n] for n, p in record['after'].items()}
        assert_same_first_adamw_update(update, ref_update, record['grads'], reference['grads'],
                                       f'rank {rank} update')
    # the step moved the parameters (two unchanged models would prove nothing)
    moved = [n for n, u in ref_update.items() if u.abs().max() > 0]
    assert len(moved) > len(ref_update) // 2


@pytest.mark.parametrize('captured_option', [False, True], ids=['eager', 'captured_option'])
def test_ddp_step_equals_one_process_accumulating_each_process_batch(config, tmp_path,
                                                                     captured_option):
    """captured_option: model.cuda_graph_step=True, which the configs' DDP wrapper
    (RedetDistributedDataParallel) hands to the model on a GPU; on the CPU it says why not and
    runs DDP's step."""
    options = ['model.cuda_graph_step=True'] if captured_option else []
    ddp = train(config, tmp_path / 'ddp', 2, *options)
    single = train(config, tmp_path / 'single', 1, 'optim_wrapper.accumulative_counts=2',
                   'train_cfg.max_iters=2')
    assert_same_step(ddp, single)
    if captured_option:
        log_file, = glob.glob(str(tmp_path / 'ddp' / '*' / '*.log'))
        with open(log_file) as f:
            assert 'cuda_graph_step: eager: the model is not on a CUDA device' in f.read()


def test_ddp_step_with_frozen_norms_equals_one_process_given_both_images(config, tmp_path):
    """Also: --auto-scale-lr gives 2 processes x batch 1 the learning rate of 1 process x batch
    2 (the tiny config's lr is for a total batch of 4)."""
    frozen, scale = 'model.backbone.norm_eval=True', ['--auto-scale-lr']
    ddp = train(config, tmp_path / 'ddp', 2, frozen, flags=scale)
    single = train(config, tmp_path / 'single', 1, frozen, 'train_dataloader.batch_size=2',
                   flags=scale)
    assert ddp[0]['lr'] == ddp[1]['lr'] == single[0]['lr'] == [1e-3 * 2 / 4]
    assert_same_step(ddp, single)


def test_two_process_test_gives_the_one_process_detections_and_map(config, tmp_path):
    from tools.test import main
    train(config, tmp_path / 'train', 1)
    checkpoint = str(tmp_path / 'train' / 'iter_1.pth')
    results = {}
    for world_size in (1, 2):
        work_dir = tmp_path / f'test{world_size}'
        run_tool(main, [config, checkpoint, '--work-dir', str(work_dir),
                        '--out', str(work_dir / 'results.pkl')], world_size)
        with open(work_dir / 'results.pkl', 'rb') as f, \
                open(work_dir / 'test_metrics.json') as g:
            results[world_size] = pickle.load(f), json.load(g)
    (single, single_metrics), (dist2, dist2_metrics) = results[1], results[2]
    image_ids = [r['img_id'] for r in single]
    assert len(image_ids) == len(set(image_ids)) == SYNTHETIC['num_val']
    assert [r['img_id'] for r in dist2] == image_ids
    assert sum(len(r['pred_instances']['scores']) for r in single) > 0
    for one, two in zip(single, dist2):
        for key in ('bboxes', 'scores', 'labels'):
            assert torch.equal(two['pred_instances'][key], one['pred_instances'][key]), \
                (one['img_id'], key)
    assert dist2_metrics == single_metrics and 'dota/mAP' in single_metrics


def test_auto_scale_lr_needs_the_batch_the_learning_rate_is_for(config, tmp_path):
    from tools.train import build_config, parse_args
    with pytest.raises(SystemExit, match=r'--auto-scale-lr: the config sets no '
                                         r'auto_scale_lr.base_batch_size'):
        build_config(parse_args([config, '--auto-scale-lr', '--work-dir', str(tmp_path),
                                 '--cfg-options', 'auto_scale_lr=None']))


@pytest.mark.parametrize('launcher, backend, message', [
    ('slurm', 'nccl', '--launcher slurm: without a GPU only --launcher pytorch'),
    ('pytorch', 'mpi', "env_cfg.dist_cfg.backend: 'mpi' cannot run on the CPU; use gloo")])
def test_cpu_processes_refuse_what_cannot_run_without_a_gpu(launcher, backend, message,
                                                             monkeypatch):
    from mmengine.config import Config

    from redet_plugin.engine.cpu_distributed import setup_cpu_distributed
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = Config(dict(launcher=launcher, env_cfg=dict(dist_cfg=dict(backend=backend))))
    with pytest.raises(SystemExit, match=message):
        setup_cpu_distributed(cfg)
    assert not dist.is_initialized()
