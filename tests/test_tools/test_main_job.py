"""The main job (tools/demo_main.py --quick: synthetic data -> train -> test -> plot), resuming,
and the clear errors the tools give for bad inputs."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet_re18_refpn_tiny_synthetic.py')
sys.path.insert(0, ROOT)
# what demo_main.py --quick generates
QUICK_SYNTHETIC = ('synthetic.num_train=4', 'synthetic.num_val=2', 'synthetic.image_size=96')


@pytest.fixture(scope='module')
def config_file():
    return TINY


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory, config_file):
    from tools.demo_main import main
    base = tmp_path_factory.mktemp('demo')
    work_dir, data_root = str(base / 'work'), str(base / 'data')
    metrics = main(['--quick', '--config', config_file, '--work-dir', work_dir,
                    '--data-root', data_root])
    return metrics, work_dir, data_root


def test_demo_main_quick_trains_tests_and_draws(demo_run):
    metrics, work_dir, data_root = demo_run
    assert 0.0 <= metrics['dota/mAP'] <= 1.0
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
    assert osp.isfile(osp.join(work_dir, 'results.pkl'))
    assert osp.getsize(osp.join(work_dir, 'curves.png')) > 1000
    pictures = os.listdir(osp.join(work_dir, 'pictures'))
    assert sorted(pictures) == sorted(os.listdir(osp.join(data_root, 'val', 'images')))


def test_resume_continues_after_the_last_finished_epoch(demo_run, config_file, tmp_path):
    _, work_dir, data_root = demo_run
    resumed_dir = str(tmp_path / 'resumed')
    shutil.copytree(work_dir, resumed_dir)
    options = [f'{loader}.dataset.{key}' for loader in ('train_dataloader', 'val_dataloader')
               for key in (f'data_root={data_root}/', *QUICK_SYNTHETIC)]
    result = subprocess.run(
        [sys.executable, 'tools/train.py', config_file, '--work-dir', resumed_dir, '--resume',
         '--cfg-options', 'train_cfg.max_epochs=2', 'train_cfg.val_interval=10',
         'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
         'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False', *options],
        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'resumed epoch: 1' in result.stdout + result.stderr
    assert osp.isfile(osp.join(resumed_dir, 'epoch_2.pth'))
    runs = sorted(d for d in os.listdir(resumed_dir) if osp.isdir(osp.join(resumed_dir, d))
                  and osp.isfile(osp.join(resumed_dir, d, 'vis_data', 'scalars.json')))
    with open(osp.join(resumed_dir, runs[-1], 'vis_data', 'scalars.json')) as f:
        epochs = {json.loads(line).get('epoch') for line in f if 'loss' in line}
    assert epochs == {2}  # epoch 1 was not trained again


def test_train_names_a_missing_data_folder(tmp_path):
    from tools.train import main
    missing = str(tmp_path / 'no_such_folder')
    config = osp.join(ROOT, 'configs/redet/redet_re50_refpn_1x_dota.py')  # DOTA: not generated
    with pytest.raises(SystemExit, match=r"train_dataloader.dataset.data_root: '.*no_such_folder"
                                         r"/?' does not exist"):
        main([config, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
              f'train_dataloader.dataset.data_root={missing}'])


def _dataset(config_file, data_root):
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    cfg = Config.fromfile(config_file)
    dataset = dict(cfg.train_dataloader.dataset, type='RedetDOTADataset', data_root=data_root + '/')
    dataset.pop('synthetic', None)  # read the folder as it is, do not regenerate it
    return DATASETS.build(dataset)


def test_annotation_line_with_7_numbers_is_named(demo_run, config_file, tmp_path):
    data_root = str(tmp_path / 'data')
    shutil.copytree(demo_run[2], data_root)
    label = osp.join(data_root, 'train', 'labelTxt', 'train_00003.txt')
    with open(label, 'a') as f:
        f.write('10 10 40 10 40 30 10\n')
    with pytest.raises(ValueError, match=r'train_00003.txt.*(line|:)'):
        _dataset(config_file, data_root)


def test_corrupt_image_is_named(demo_run, config_file, tmp_path):
    data_root = str(tmp_path / 'data')
    shutil.copytree(demo_run[2], data_root)
    image = osp.join(data_root, 'train', 'images', 'train_00000.png')
    with open(image, 'wb') as f:
        f.write(b'not a png')
    with pytest.raises(Exception, match='train_00000.png'):  # when listed or when loaded
        dataset = _dataset(config_file, data_root)
        for i in range(len(dataset)):
            dataset.prepare_data(i)


def test_checkpoint_from_a_different_model_is_refused(demo_run, tmp_path):
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    from tools._common import check_checkpoint_matches
    init_default_scope('mmdet')
    _, work_dir, _ = demo_run
    cfg = Config.fromfile(osp.join(work_dir, osp.basename(
        [f for f in os.listdir(work_dir) if f.endswith('.py')][0])))
    model = MODELS.build(cfg.model)
    check_checkpoint_matches(model, osp.join(work_dir, 'epoch_1.pth'))  # its own: accepted
    cfg.model.roi_head.bbox_head[1].num_classes = 7
    other = MODELS.build(cfg.model)
    torch.save({'state_dict': other.state_dict()}, tmp_path / 'other.pth')
    with pytest.raises(SystemExit, match=r'is from a different model: .*wrong shape.*fc_cls'):
        check_checkpoint_matches(model, str(tmp_path / 'other.pth'))
