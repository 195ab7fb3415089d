"""A trained mmrotate ReDet checkpoint gives mmrotate's detections and mAP through our
tools/test.py with configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py.

mmrotate's ReDet (its own config, mmcv's kernels) is trained on the GPU by an mmengine Runner
on generated 512² DOTA-format images until its detections are many and confident (a briefly
trained model has few, and hides what only shows with many: near-ties in the NMS, thresholds),
and tested by a Runner with its config's test loop and DOTAMetric. The same file then goes
through our tools/test.py as a user runs it (the config's defaults: captured features,
channels-last, the fixed-size NMS), on the GPU and on the CPU (there mmrotate's second RoI stage
runs our RiRoIAlignRotated with legacy_orientation=True, as mmcv's kernel has no CPU code; the CPU
runs test the first CPU_IMAGES images, since two R50 detectors on the CPU take minutes).
In float32 image by image the detections must match (same label, score within 1e-3, box numbers
within 1e-3 of the box's size), and the mAP within 0.002.
With TF32, as torch sets it for cuDNN's convolutions, each model's convolutions round their
inputs to 10 bits, and the two models' kernels (channels-last here, e2cnn's NCHW there) round
different sums: a few detections move by more than 1e-3 (measured on an H200: 28 of 449, mAP
0.9360 both). There the mAPs must agree within 0.002, and no more of our detections may move
than twice as many as mmrotate's own TF32 run moves from its float32 run, or a tenth of them.
"""
import os
import os.path as osp
import pickle
from unittest import mock

import pytest
import torch

from tests._helpers import REPO, all_cores, full_fp32, once_per_run, register_mmrotate

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

register_mmrotate()
import mmrotate  # noqa: E402
import redet_plugin.mm  # noqa: E402,F401
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import Runner  # noqa: E402
from mmengine.runner import runner as mmengine_runner  # noqa: E402

# (mmrotate's DOTADataset cannot read the labels' imagesource:/gsd: lines)
from benchmarks.detector.bench_detector_vs_mmrotate import write_peer_labels  # noqa: E402
from redet_plugin.datasets import generate_synthetic_dota  # noqa: E402

OUR_CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py')
MMROTATE_CONFIG = osp.join(osp.dirname(mmrotate.__file__),
                           '.mim/configs/redet/redet-le90_re50_refpn_1x_dota.py')
SIZE = 512
TRAIN_ITERS = 300
SCORE_TOL = 1e-3
BOX_RTOL = 1e-3
MAP_TOL = 0.002
CPU_IMAGES = 6
TEST_SPLIT = dict(cuda='val', cpu='val_cpu')  # (val_cpu: the first CPU_IMAGES of val)


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return once_per_run(tmp_path_factory, 'mmrotate_data_root', lambda: make_data_root(
        str(tmp_path_factory.mktemp('dota512'))))


def make_data_root(root):
    generate_synthetic_dota(root, num_train=64, num_val=16, image_size=SIZE, seed=3,
                            progress=False)
    for split in ('train', 'val'):
        write_peer_labels(osp.join(root, split))
    link_head_split(root, 'val', TEST_SPLIT['cpu'], CPU_IMAGES)
    return root


def link_head_split(root, split, name, count):
    """<root>/<name>/: links to the first `count` images of <root>/<split> and their labels."""
    stems = sorted(osp.splitext(f)[0] for f in os.listdir(osp.join(root, split, 'images')))
    for folder, ext in (('images', '.png'), ('labelTxt', '.txt'), ('annfiles', '.txt')):
        os.makedirs(osp.join(root, name, folder))
        for stem in stems[:count]:
            os.symlink(osp.join(root, split, folder, stem + ext),
                       osp.join(root, name, folder, stem + ext))


def mmrotate_config(data_root: str, work_dir: str, cpu: bool = False) -> Config:
    """mmrotate's ReDet config on the generated set: its model, optimizer and test settings;
    a short iteration-based schedule from random weights; 512² resizes; with `cpu`, the CPU's
    test split and RoI layer."""
    cfg = Config.fromfile(MMROTATE_CONFIG)
    cfg.work_dir = work_dir
    cfg.model.backbone.init_cfg = None  # no ImageNet file here
    cfg.model.backbone.frozen_stages = -1
    if cpu:  # mmcv's RiRoIAlignRotated has no CPU kernel: ours, bit-compatible with it
        cfg.model.roi_head.bbox_roi_extractor[1].type = 'mmdet.RedetRotatedSingleRoIExtractor'
        cfg.model.roi_head.bbox_roi_extractor[1].roi_layer = dict(
            type='RedetRiRoIAlignRotated', output_size=7, num_samples=2, num_orientations=8,
            clockwise=True, legacy_orientation=True)
    for key, split in (('train_dataloader', 'train'),
                       ('test_dataloader', TEST_SPLIT['cpu' if cpu else 'cuda'])):
        loader = cfg[key]
        loader.num_workers, loader.persistent_workers = 2, False
        loader.dataset.update(data_root=data_root + '/', ann_file=f'{split}/annfiles/',
                              data_prefix=dict(img_path=f'{split}/images/'))
        for step in loader.dataset.pipeline:
            if step.type.endswith('Resize'):
                step.scale = (SIZE, SIZE)
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=TRAIN_ITERS)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=1 / 3, by_epoch=False, begin=0,
                                end=50)]
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=TRAIN_ITERS)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=50)
    cfg.log_processor = dict(by_epoch=False)
    cfg.randomness = dict(seed=0)
    return cfg


@pytest.fixture(scope='module')
def checkpoint(data_root, tmp_path_factory):
    """mmrotate's ReDet trained by mmrotate's configuration on the GPU."""
    return once_per_run(tmp_path_factory, 'mmrotate_checkpoint', lambda: train_mmrotate(
        data_root, str(tmp_path_factory.mktemp('mmrotate_train'))))


def train_mmrotate(data_root, work_dir):
    cfg = mmrotate_config(data_root, work_dir)
    cfg.dump(osp.join(work_dir, 'mmrotate_config.py'))  # for benchmarks/detector/mmrotate_parity.py
    runner = Runner.from_cfg(cfg)
    runner.train()
    del runner
    torch.cuda.empty_cache()
    return osp.join(work_dir, f'iter_{TRAIN_ITERS}.pth')


def on_device(device: str):
    """mmengine's Runner puts the model on get_device(): patched for the CPU runs."""
    if device == 'cuda':
        return mock.patch.object(mmengine_runner, 'get_device', mmengine_runner.get_device)
    return mock.patch.object(mmengine_runner, 'get_device', lambda: 'cpu')


def their_test(data_root, checkpoint, device, work_dir):
    """mmrotate's test of the checkpoint (its Runner, test loop and DOTAMetric): (mAP, {image:
    detections})."""
    os.makedirs(work_dir, exist_ok=True)
    cfg = mmrotate_config(data_root, work_dir, cpu=device == 'cpu')
    cfg.load_from = checkpoint
    out = osp.join(work_dir, 'theirs.pkl')
    cfg.test_evaluator = [dict(cfg.test_evaluator),
                          dict(type='mmdet.DumpDetResults', out_file_path=out)]
    with on_device(device):
        metrics = Runner.from_cfg(cfg).test()
    return metrics['dota/mAP'], read_detections(out)


def our_test(data_root, checkpoint, device, work_dir):
    """Our tools/test.py with the mmrotate-compatible config, as a user runs it."""
    from tools.test import main
    os.makedirs(work_dir, exist_ok=True)
    config, split = osp.join(work_dir, 'ours.py'), TEST_SPLIT[device]
    with open(config, 'w') as f:
        f.write(f"""_base_ = [{OUR_CONFIG!r}]
test_dataloader = dict(num_workers=2, persistent_workers=False, dataset=dict(
    data_root={data_root + '/'!r}, ann_file='{split}/labelTxt/', data_prefix=dict(img_path='{split}/images/'),
    pipeline=[dict(type='LoadImageFromFile'), dict(type='Resize', scale=({SIZE}, {SIZE}), keep_ratio=True),
              dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
              dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                                    'scale_factor'))]))
test_evaluator = dict(_delete_=True, type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')
""")
    out = osp.join(work_dir, 'ours.pkl')
    init_default_scope('mmdet')
    with on_device(device):
        metrics = main([config, checkpoint, '--work-dir', osp.join(work_dir, 'ours'), '--out', out])
    return metrics['dota/mAP'], read_detections(out)


def read_detections(path):
    with open(path, 'rb') as f:
        results = pickle.load(f)
    found = {}
    for result in results:
        pred = result['pred_instances']
        boxes = pred['bboxes']
        boxes = getattr(boxes, 'tensor', boxes)
        found[osp.basename(result['img_path'])] = (boxes.double(), pred['scores'].double(),
                                                    pred['labels'])
    return found


def unmatched(ours, theirs):
    """Our detections without a one-to-one counterpart among theirs (same label, score within
    SCORE_TOL, each box number within BOX_RTOL of the box's size, the angle within BOX_RTOL),
    plus how many of theirs are left over."""
    (boxes, scores, labels), (tb, ts, tl) = ours, theirs
    if len(scores) == 0 or len(ts) == 0:
        return len(scores), len(ts)
    scale = boxes[:, 2:4].abs().amax(dim=1).clamp(min=1)
    box_diff = ((boxes[:, None, :4] - tb[None, :, :4]).abs() / scale[:, None, None]).amax(-1)
    box_diff = torch.maximum(box_diff, (boxes[:, None, 4] - tb[None, :, 4]).abs())
    score_diff = (scores[:, None] - ts[None, :]).abs()
    ok = (labels[:, None] == tl[None, :]) & (score_diff <= SCORE_TOL) & (box_diff <= BOX_RTOL)
    cost = torch.where(ok, score_diff / SCORE_TOL + box_diff / BOX_RTOL, torch.inf)
    free = torch.ones(len(ts), dtype=torch.bool)
    missing = 0
    for i in scores.argsort(descending=True).tolist():
        row = torch.where(free, cost[i], torch.inf)
        j = int(row.argmin())
        if torch.isfinite(row[j]):
            free[j] = False
        else:
            missing += 1
    return missing, int(free.sum())


def differing(ours: dict, theirs: dict) -> dict:
    """{image: (ours unmatched, theirs left over)} of the images whose detections differ."""
    assert set(ours) == set(theirs)
    report = {name: unmatched(ours[name], theirs[name]) for name in sorted(theirs)}
    return {name: counts for name, counts in report.items() if counts != (0, 0)}


def check_trained(their_map, theirs):
    total = sum(len(found[1]) for found in theirs.values())
    assert total >= 10 * len(theirs), f'{total} detections: too few to show a difference'
    assert their_map >= 0.5, f'mmrotate reaches mAP {their_map}: trained too little'
    return total


@pytest.mark.parametrize('device', ['cuda', 'cpu'])
def test_trained_mmrotate_checkpoint_gives_mmrotates_map_and_detections(
        data_root, checkpoint, device, tmp_path):
    with full_fp32() if device == 'cuda' else all_cores():
        their_map, theirs = their_test(data_root, checkpoint, device, str(tmp_path / 'theirs'))
        our_map, ours = our_test(data_root, checkpoint, device, str(tmp_path / 'ours'))
    total = check_trained(their_map, theirs)
    bad = differing(ours, theirs)
    assert not bad, (f'images whose detections differ (ours unmatched, theirs left over), of '
                     f'{total}: {bad}; mAP ours {our_map}, theirs {their_map}')
    assert abs(our_map - their_map) <= MAP_TOL, (our_map, their_map)


def test_with_tf32_the_map_is_mmrotates_and_detections_move_no_more_than_its_own(
        data_root, checkpoint, tmp_path):
    """TF32 as torch sets it (cuDNN's convolutions) in both projects' runs."""
    assert torch.backends.cudnn.allow_tf32
    their_map, theirs = their_test(data_root, checkpoint, 'cuda', str(tmp_path / 'theirs'))
    our_map, ours = our_test(data_root, checkpoint, 'cuda', str(tmp_path / 'ours'))
    with full_fp32():
        _, their_fp32 = their_test(data_root, checkpoint, 'cuda', str(tmp_path / 'fp32'))
    total = check_trained(their_map, theirs)
    ours_moved = sum(counts[0] for counts in differing(ours, theirs).values())
    theirs_moved = sum(counts[0] for counts in differing(theirs, their_fp32).values())
    print(f'TF32: {ours_moved} of our {total} detections differ from mmrotate\'s, '
          f'{theirs_moved} of mmrotate\'s from its float32 run; mAP {our_map} / {their_map}')
    assert ours_moved <= max(2 * theirs_moved, 0.1 * total), (ours_moved, theirs_moved, total)
    assert abs(our_map - their_map) <= MAP_TOL, (our_map, their_map)
