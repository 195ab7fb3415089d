"""ReDet's multi-scale + rotation recipe (configs/redet/redet-le90_re50_refpn_rr-1x_dota-ms.py, and
its DOTA-v1.5 twin ..._rr-1x_dota15-ms.py) end to end on the CPU: generated 600 x 600 DOTA-format images, split at rates 0.5, 1.0 and 1.5 by
tools/dataset_converters/dota_split.py, two training iterations through tools/train.py (the recipe with the
tiny model), detection on the test patches through tools/test.py, merged back into the full
images' pixels as Task1 files. Also: the preparation commands of the config's header, the
recipe's and the HRSC base config's pipelines and evaluators build, and the recipe's rotation
keeps upright-annotated objects upright."""
import glob
import importlib.util
import inspect
import os
import os.path as osp
import pickle
import random
import shlex
import shutil
import sys

import numpy as np
import pytest
import torch
from mmdet.registry import DATASETS, METRICS, TRANSFORMS
from mmdet.structures.bbox import get_box_type
from mmengine.config import Config
from mmengine.registry import DefaultScope, init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import SYNTHETIC_CLASSES, generate_synthetic_dota, parse_patch_id
from redet_plugin.datasets.dota_split import read_dota_objects
from redet_plugin.evaluation import merge_patch_detections
from redet_plugin.structures import qbox2rbox, rbox2qbox

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)
MS_CONFIG = osp.join(ROOT, 'configs/redet/redet-le90_re50_refpn_rr-1x_dota-ms.py')
MS15_CONFIG = osp.join(ROOT, 'configs/redet/redet-le90_re50_refpn_rr-1x_dota15-ms.py')
# each recipe -> the single-scale config whose model and schedule it keeps
SINGLE_SCALE = {MS_CONFIG: 'configs/redet/redet-le90_re50_refpn_1x_dota.py',
                MS15_CONFIG: 'configs/redet/redet-le90_re50_refpn_1x_dota15.py'}
MS_DATA = osp.join(ROOT, 'configs/_base_/datasets/dota_ms.py')
HRSC_DATA = osp.join(ROOT, 'configs/_base_/datasets/hrsc.py')
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
RATES = (0.5, 1.0, 1.5)
IMAGE_SIZE, PATCH, GAP = 600, 256, 64


def load_tool(path):
    spec = importlib.util.spec_from_file_location('tool_under_test', osp.join(ROOT, 'tools', path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_split(argv):
    """tools/dataset_converters/dota_split.py with this command line, in this process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, 'argv', ['dota_split.py'] + argv)
        load_tool('dataset_converters/dota_split.py').main()


@pytest.fixture(scope='module')
def ms_data(tmp_path_factory):
    """raw/{train,val}: 3 + 2 generated 600² images; raw/test: the val images without labels;
    split/{trainval,test}: both split at the three rates (patches of 256, gap 64)."""
    base = tmp_path_factory.mktemp('ms')
    raw, split = base / 'raw', base / 'split'
    generate_synthetic_dota(str(raw), num_train=3, num_val=2, image_size=IMAGE_SIZE, progress=False)
    shutil.copytree(raw / 'val' / 'images', raw / 'test' / 'images')
    rates = ['--rates', *map(str, RATES)]
    for src, dst in (('train', 'trainval'), ('test', 'test')):
        run_split([str(raw / src), str(split / dst), '--patch-size', str(PATCH), '--gap', str(GAP), *rates])
    return raw, split


def patches_per_image():
    """Patch count of one 600² image: per rate, the windows per axis squared."""
    from redet_plugin.datasets import patch_origins
    return sum(len(patch_origins(round(IMAGE_SIZE * r), PATCH, GAP)) ** 2 for r in RATES)


def test_split_writes_every_rate(ms_data):
    raw, split = ms_data
    assert patches_per_image() == 4 + 9 + 25
    names = os.listdir(split / 'trainval' / 'images')
    assert len(names) == 3 * patches_per_image() == len(os.listdir(split / 'trainval' / 'labelTxt'))
    assert {parse_patch_id(osp.splitext(n)[0])[1] for n in names} == set(RATES)
    assert len(os.listdir(split / 'test' / 'images')) == 2 * patches_per_image()
    assert not osp.exists(split / 'test' / 'labelTxt')  # a test set: images only


def test_merge_maps_every_rate_back_to_the_full_image(ms_data):
    """The split's own patch labels, taken as detections of each rate alone and merged by the
    metric's merge (coordinates + patch corner, / rate), are the full image's objects again."""
    raw, split = ms_data
    classes = list(SYNTHETIC_CLASSES)
    for rate in RATES:
        per_patch = []
        for txt in sorted(glob.glob(str(split / 'trainval' / 'labelTxt' / f'*__{rate:g}__*.txt'))):
            objects = read_dota_objects(txt)
            if not objects:
                continue
            quads = np.stack([coords for coords, _, _ in objects])
            # objects cut by the patch border (difficulty 2) lose against whole ones
            scores = np.array([0.5 if difficulty == 2 else 1.0 for _, _, difficulty in objects], np.float32)
            labels = np.array([classes.index(name) for _, name, _ in objects])
            per_patch.append((osp.splitext(osp.basename(txt))[0], qbox2rbox(torch.from_numpy(quads)).numpy(),
                              scores, labels))
        merged = merge_patch_detections(per_patch, iou_thr=0.1)
        assert sorted(name for name, *_ in merged) == ['train_00000', 'train_00001', 'train_00002']
        for name, boxes, scores, labels in merged:
            truth = read_dota_objects(str(raw / 'train' / 'labelTxt' / f'{name}.txt'))
            truth_boxes = qbox2rbox(torch.from_numpy(np.stack([c for c, _, _ in truth]))).numpy()
            truth_labels = np.array([classes.index(n) for _, n, _ in truth])
            assert ((boxes[:, :2] >= 0) & (boxes[:, :2] <= IMAGE_SIZE)).all()
            whole = boxes[scores == 1.0], labels[scores == 1.0]
            # every whole object is one of the image's, at its place and of its size (the patch
            # files keep 2 decimals of the scaled corners). Compared by numbers: mmcv's rotated
            # IoU of two nearly equal boxes can come out far below 1.
            centre = np.linalg.norm(whole[0][:, None, :2] - truth_boxes[None, :, :2], axis=-1)
            centre[whole[1][:, None] != truth_labels[None, :]] = np.inf
            nearest = centre.argmin(1)
            assert centre.min(1).max() < 0.05, (rate, name)
            assert np.abs(whole[0][:, 2:4] - truth_boxes[nearest, 2:4]).max() < 0.05
            turn = np.abs(whole[0][:, 4] - truth_boxes[nearest, 4]) % np.pi
            assert np.minimum(turn, np.pi - turn).max() < 1e-2
            assert len(set(nearest)) == len(nearest)  # each object once
            assert len(nearest) >= 0.6 * len(truth)  # most objects are whole in some patch


@pytest.mark.parametrize('config', [MS_CONFIG, MS15_CONFIG], ids=osp.basename)
def test_config_header_gives_the_preparation_commands(config):
    """The split commands at the top of the recipe (and of its data base) are dota_split.py's
    command lines for ReDet's and mmrotate's multi-scale split, writing where the config reads."""
    cfg = Config.fromfile(config)
    tool = load_tool('dataset_converters/dota_split.py')
    for path in (config, MS_DATA) if config == MS_CONFIG else (config,):
        with open(path) as f:
            commands = [line.lstrip('# ').strip() for line in f
                        if line.lstrip('# ').startswith('python tools/dataset_converters/dota_split.py')]
        assert len(commands) == 3, path
        destinations = {}
        for command in commands:
            words = shlex.split(command)
            assert words[:2] == ['python', 'tools/dataset_converters/dota_split.py']
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, 'argv', words[1:])
                args = tool.parse_args()
            assert (args.patch_size, args.gap, args.rates) == (1024, 500, [0.5, 1.0, 1.5])
            destinations[osp.basename(args.src)] = osp.relpath(args.dst, cfg.data_root)
        assert destinations == {'train': 'trainval', 'val': 'trainval', 'test': 'test'}
    train, test = cfg.train_dataloader.dataset, cfg.test_dataloader.dataset
    assert train.data_root == test.data_root == cfg.data_root
    assert (train.ann_file, train.data_prefix.img_path) == ('trainval/labelTxt/', 'trainval/images/')
    assert (test.ann_file, test.data_prefix.img_path) == ('', 'test/images/')


def build_pipelines_and_metrics(cfg):
    with DefaultScope.overwrite_default_scope('mmdet'):
        for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            if cfg.get(loader):
                assert [type(TRANSFORMS.build(t)).__name__ for t in cfg[loader].dataset.pipeline]
        for key in ('val_evaluator', 'test_evaluator'):
            if cfg.get(key):
                evaluators = cfg[key] if isinstance(cfg[key], list) else [cfg[key]]
                for metric in evaluators:
                    METRICS.build(metric)


@pytest.mark.parametrize('config', [MS_CONFIG, MS15_CONFIG], ids=osp.basename)
def test_ms_config_builds(config):
    cfg = Config.fromfile(config)
    build_pipelines_and_metrics(cfg)
    assert cfg.val_cfg is None and cfg.val_dataloader is None and cfg.val_evaluator is None
    rotate = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RedetRandomRotate']
    assert rotate == [dict(type='RedetRandomRotate', prob=0.5, max_angle=180, rect_obj_labels=[9, 11])]
    single_scale = Config.fromfile(osp.join(ROOT, SINGLE_SCALE[config]))
    dataset_type = single_scale.train_dataloader.dataset.type
    assert cfg.train_dataloader.dataset.type == cfg.test_dataloader.dataset.type == dataset_type
    classes = DATASETS.get(dataset_type).METAINFO['classes']
    assert [classes[i] for i in rotate[0].rect_obj_labels] == ['storage-tank', 'roundabout']
    assert cfg.test_evaluator.merge_patches and cfg.test_evaluator.format_only
    # each recipe writes its submission files in a folder of its own
    assert cfg.test_evaluator.outfile_prefix != single_scale.test_evaluator.outfile_prefix
    if config != MS_CONFIG:
        assert cfg.test_evaluator.outfile_prefix != Config.fromfile(MS_CONFIG).test_evaluator.outfile_prefix
    # the model and schedule of the single-scale config
    assert cfg.model == single_scale.model and cfg.optim_wrapper == single_scale.optim_wrapper
    assert cfg.param_scheduler == single_scale.param_scheduler and cfg.train_cfg == single_scale.train_cfg


def test_hrsc_config_builds():
    cfg = Config.fromfile(HRSC_DATA)
    build_pipelines_and_metrics(cfg)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = cfg[loader].dataset
        assert dataset.type == 'RedetHRSCDataset' and dataset.classwise is False
        assert dataset.data_prefix == dict(sub_data_root='FullDataSet/')
    assert cfg.train_dataloader.dataset.ann_file == 'ImageSets/trainval.txt'
    assert cfg.test_dataloader.dataset.ann_file == 'ImageSets/test.txt'
    resize = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'Resize']
    assert resize[0].scale == (800, 512)
    assert [m.prefix for m in cfg.val_evaluator] == ['hrsc_voc07', 'hrsc_voc12']
    hrsc = DATASETS.get('RedetHRSCDataset')
    if hrsc is None:
        pytest.skip('RedetHRSCDataset is not registered (yet): its constructor was not checked')
    assert 'classwise' in inspect.signature(hrsc.__init__).parameters  # mmrotate's HRSCDataset's


@pytest.mark.parametrize('labels,upright', [([0, 2, 1], True), ([0, 1], False)])
def test_rotation_keeps_upright_annotated_objects_upright(labels, upright):
    """mmrotate's rect_obj_labels: an image with such an object turns by multiples of 90 degrees."""
    init_default_scope('mmdet')
    rotate = TRANSFORMS.build(dict(type='RedetRandomRotate', prob=1.0, max_angle=180, rect_obj_labels=[2]))
    box_type = get_box_type('redet_rbox')[1]
    angles = set()
    for seed in range(20):
        random.seed(seed)
        results = dict(img=np.zeros((200, 200, 3), np.uint8), img_shape=(200, 200),
                       gt_bboxes=box_type(torch.tensor([[100., 100., 40., 20., 0.]] * len(labels))),
                       gt_bboxes_labels=np.array(labels), gt_ignore_flags=np.zeros(len(labels), bool))
        out = rotate(results)
        angles.add(round(float(out['rotate_angle']), 6))
        theta = out['gt_bboxes'].tensor[:, 4]
        if upright:
            assert torch.allclose(torch.remainder(theta + 1e-4, np.pi / 2), torch.tensor(1e-4), atol=1e-3)
    if upright:
        assert angles <= {90.0, 180.0, -90.0, -180.0} and len(angles) > 1
    else:
        assert len(angles) == 20 and not angles <= {90.0, 180.0, -90.0, -180.0}
    assert 'rect_obj_labels=[2]' in repr(rotate)


def tiny_ms_config(config, path, data_root, outfile_prefix):
    """The recipe `config` with the tiny model (configs/redet/redet-le90_re18_refpn_tiny-synthetic.py),
    the synthetic classes, 256² patches at their size, the first 4 training patches, one process."""
    tiny_model = Config.fromfile(TINY).model.to_dict()
    path.write_text(f'''_base_ = [{config!r}]
model = dict(_delete_=True, **{tiny_model!r})
classes = {tuple(SYNTHETIC_CLASSES)!r}
data_root = {str(data_root) + '/'!r}
# the synthetic set's storage tank is label 2
train_pipeline = [dict(t, scale=({PATCH}, {PATCH})) if t['type'] == 'Resize' else
                  dict(t, rect_obj_labels=[2]) if t['type'] == 'RedetRandomRotate' else t
                  for t in _base_.train_pipeline]
test_pipeline = [dict(t, scale=({PATCH}, {PATCH})) if t['type'] == 'Resize' else t
                 for t in _base_.test_pipeline]
loader = dict(num_workers=0, persistent_workers=False, pin_memory=False)
train_dataloader = dict(**loader, dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                                               indices=4, pipeline=train_pipeline))
test_dataloader = dict(**loader, dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                                              pipeline=test_pipeline))
test_evaluator = dict(outfile_prefix={str(outfile_prefix)!r})
train_cfg = dict(max_epochs=1)
default_hooks = dict(logger=dict(interval=1))
# mmengine keeps one visualizer per name in the process: one of this run's own, so that its
# scalars go to this run's work dir whatever ran before in the process
visualizer = dict(name={'visualizer_' + path.parent.name!r})
''')
    return str(path)


@pytest.mark.parametrize('recipe', [MS_CONFIG, MS15_CONFIG], ids=osp.basename)
def test_train_and_test_on_multiscale_patches_merge_into_full_images(recipe, ms_data, tmp_path):
    from tools.test import main as test_main
    from tools.train import main as train_main
    raw, split = ms_data
    task1 = tmp_path / 'Task1'
    config = tiny_ms_config(recipe, tmp_path / 'tiny_ms.py', split, task1)
    work_dir = str(tmp_path / 'work')
    train_main([config, '--work-dir', work_dir])
    with open(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))[0]) as f:
        assert sum('"loss"' in line for line in f) == 2  # two iterations (batch 2 of 4 patches)
    checkpoint = osp.join(work_dir, 'epoch_1.pth')
    assert osp.isfile(checkpoint)

    out = str(tmp_path / 'patches.pkl')
    test_main([config, checkpoint, '--work-dir', str(tmp_path / 'test'), '--out', out])
    # one Task1 file per class, whose lines are detections on the full test images
    assert sorted(os.listdir(task1)) == sorted(f'Task1_{c}.txt' for c in SYNTHETIC_CLASSES)
    lines = [line.split() for c in SYNTHETIC_CLASSES for line in (task1 / f'Task1_{c}.txt').read_text().splitlines()]
    assert lines, 'no detection written'
    assert {fields[0] for fields in lines} == {'val_00000', 'val_00001'}  # full image names
    corners = np.array([[float(v) for v in fields[2:]] for fields in lines]).reshape(-1, 4, 2)
    centres = corners.mean(1)
    assert ((centres >= 0) & (centres <= IMAGE_SIZE)).all()
    # the same merge of the raw per-patch detections: each patch's boxes / its rate
    with open(out, 'rb') as f:
        per_patch = pickle.load(f)
    assert len(per_patch) == 2 * patches_per_image()
    assert {parse_patch_id(p['img_id'])[1] for p in per_patch} == set(RATES)
    merged = merge_patch_detections(
        [(p['img_id'], numpy(p['pred_instances']['bboxes']), numpy(p['pred_instances']['scores']),
          numpy(p['pred_instances']['labels'])) for p in per_patch], iou_thr=0.1)
    assert sum(len(scores) for _, _, scores, _ in merged) == len(lines)
    expected = np.concatenate([rbox2qbox(torch.from_numpy(boxes)).numpy() for _, boxes, _, _ in merged])
    distance = np.abs(corners.reshape(-1, 1, 8) - expected.reshape(1, -1, 8)).max(-1)
    assert distance.min(1).max() <= 0.051 and distance.min(0).max() <= 0.051  # written with 1 decimal


def numpy(value):
    return np.asarray(getattr(value, 'tensor', value))
