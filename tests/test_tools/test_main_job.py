"""The demo (scripts/demo_main.py --quick: synthetic data -> train -> test -> plot), resuming,
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
from redet_plugin.datasets import DOTA_V1_CLASSES, DOTAAnnotationWarning

from tests._helpers import once_per_run, own_logger

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
sys.path.insert(0, ROOT)
# what demo_main.py --quick generates
QUICK_SYNTHETIC = ('synthetic.num_train=4', 'synthetic.num_val=2', 'synthetic.image_size=96')


@pytest.fixture(scope='module')
def config_file():
    return TINY


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory, config_file):
    return once_per_run(tmp_path_factory, 'demo_run', lambda: run_demo(
        config_file, tmp_path_factory.mktemp('demo')))


def run_demo(config_file, base):
    """(the test metrics, the work folder, the data folder) of a quick demo run."""
    from scripts.demo_main import main
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
    config = osp.join(ROOT, 'configs/redet/redet-le90_re50_refpn_1x_dota.py')  # DOTA: not generated
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
    from redet_plugin.utils.checkpoint_check import CheckpointMismatchError, load_checked_checkpoint
    init_default_scope('mmdet')
    _, work_dir, _ = demo_run
    cfg = Config.fromfile(osp.join(work_dir, osp.basename(
        [f for f in os.listdir(work_dir) if f.endswith('.py')][0])))
    model = MODELS.build(cfg.model)
    load_checked_checkpoint(model, osp.join(work_dir, 'epoch_1.pth'))  # its own: accepted
    cfg.model.roi_head.bbox_head[1].num_classes = 7
    other = MODELS.build(cfg.model)
    torch.save({'state_dict': other.state_dict()}, tmp_path / 'other.pth')
    with pytest.raises(CheckpointMismatchError, match=r'is from a different model: .*wrong shape.*fc_cls'):
        load_checked_checkpoint(model, str(tmp_path / 'other.pth'))


def _tiny_options(data_root, loaders=('train_dataloader', 'val_dataloader', 'test_dataloader')):
    """--cfg-options for the tiny config on a quick synthetic set under data_root, in one process."""
    return [f'{loader}.{key}' for loader in loaders
            for key in (f'dataset.data_root={data_root}/', *(f'dataset.{s}' for s in QUICK_SYNTHETIC),
                        'num_workers=0', 'persistent_workers=False')] + ['train_cfg.max_epochs=1']


DOTA_CLASSES = '[' + ','.join(DOTA_V1_CLASSES) + ']'  # a --cfg-options list


def test_train_refuses_amp_without_a_gpu_before_building_anything(tmp_path, monkeypatch, capsys):
    from tools.train import main
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit, match=r'^error: --amp needs a GPU .*none is available$'):
        main([TINY, '--amp', '--work-dir', str(tmp_path / 'w'), '--cfg-options',
              *_tiny_options(tmp_path / 'data')])
    assert not osp.exists(tmp_path / 'data')  # refused before the Runner made the data set
    with pytest.raises(SystemExit):
        main(['--help'])
    assert '--amp mixed precision (an AMP optim wrapper); needs a GPU' in ' '.join(capsys.readouterr().out.split())


def test_test_amp_autocasts_the_test_loop_and_refuses_without_a_gpu(tmp_path, monkeypatch):
    import tools.test as test_tool
    checkpoint = tmp_path / 'any.pth'
    checkpoint.write_bytes(b'')  # (the loop is configured before the checkpoint is read)
    monkeypatch.setattr(test_tool, 'gpu_available', lambda: False)
    with pytest.raises(SystemExit, match=r'^error: --amp needs a GPU .*none is available$'):
        test_tool.build_config(test_tool.parse_args([TINY, str(checkpoint), '--amp']))
    monkeypatch.setattr(test_tool, 'gpu_available', lambda: True)
    cfg = test_tool.build_config(test_tool.parse_args([TINY, str(checkpoint), '--amp']))
    assert cfg.test_cfg == dict(type='RedetTestLoop', fp16=True)
    assert 'fp16' not in test_tool.build_config(test_tool.parse_args([TINY, str(checkpoint)])).test_cfg


def test_test_runs_plain_convolutions_unless_told_equivariant(demo_run, tmp_path):
    import glob
    from tools.test import main
    _, work_dir, data_root = demo_run
    options = ['--cfg-options', *_tiny_options(data_root, ('test_dataloader',))]
    checkpoint = osp.join(work_dir, 'epoch_1.pth')
    maps, logs = {}, {}
    for how, extra in (('plain', []), ('equivariant', ['--equivariant'])):
        out = str(tmp_path / how)
        maps[how] = main([TINY, checkpoint, '--work-dir', out, *extra, *options,
                          own_logger(f'plain-{how}')])['dota/mAP']
        log_file, = glob.glob(osp.join(out, '*', '*.log'))
        logs[how] = open(log_file).read()
    assert '2 equivariant network(s) run as plain convolutions' in logs['plain']
    assert 'plain convolutions' not in logs['equivariant']
    assert maps['plain'] == pytest.approx(maps['equivariant'], abs=0.002)


@pytest.mark.cuda
def test_test_amp_gives_about_the_float32_map(demo_run, tmp_path):
    from tools.test import main
    _, work_dir, data_root = demo_run
    args = [TINY, osp.join(work_dir, 'epoch_1.pth'), '--cfg-options',
            *_tiny_options(data_root, ('test_dataloader',))]
    fp32 = main([*args[:2], '--work-dir', str(tmp_path / 'fp32'), *args[2:]])
    amp = main([*args[:2], '--work-dir', str(tmp_path / 'amp'), '--amp', *args[2:]])
    assert amp['dota/mAP'] == pytest.approx(fp32['dota/mAP'], abs=0.02)


def test_train_names_a_missing_load_from(tmp_path):
    from tools.train import main
    with pytest.raises(SystemExit, match=r"^error: load_from: checkpoint '.*nonexist\.pth' does not exist$"):
        main([TINY, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(tmp_path / 'data'),
              f'load_from={tmp_path / "nonexist.pth"}'])


def test_train_refuses_load_from_a_checkpoint_of_another_model(tmp_path):
    """mmengine only warns about the missing keys and trains from scratch."""
    from tools.train import main
    torch.save({'state_dict': torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3)).state_dict()}, tmp_path / 'other.pth')
    with pytest.raises(SystemExit, match=r"^error: checkpoint '.*other\.pth' is from a different model: "
                                         r"\d+ missing, 2 unexpected"):
        main([TINY, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(tmp_path / 'data'),
              f'load_from={tmp_path / "other.pth"}'])
    assert not osp.exists(tmp_path / 'w' / 'epoch_1.pth')


def test_load_from_accepts_a_checkpoint_with_other_heads(tmp_path):
    """Fine-tuning on other classes: only the classifier and regressor do not fit."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    from redet_plugin.utils.checkpoint_check import CheckpointMismatchError, load_checked_checkpoint
    init_default_scope('mmdet')
    cfg = Config.fromfile(TINY)
    model = MODELS.build(cfg.model)
    for head in cfg.model.roi_head.bbox_head:
        head.num_classes = 7
    torch.save({'state_dict': MODELS.build(cfg.model).state_dict()}, tmp_path / 'seven.pth')
    load_checked_checkpoint(model, str(tmp_path / 'seven.pth'), strict=False)
    with pytest.raises(CheckpointMismatchError, match='wrong shape'):  # but it is not this model's own checkpoint
        load_checked_checkpoint(model, str(tmp_path / 'seven.pth'))


def test_test_refuses_a_data_set_of_other_classes(demo_run, tmp_path):
    """A 5-class model scored against DOTA's 15 classes gave a wrong mAP without a word."""
    from tools.test import main
    _, work_dir, data_root = demo_run
    args = ['--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(data_root, ('test_dataloader',)),
            f'test_dataloader.dataset.metainfo.classes={DOTA_CLASSES}']
    with pytest.raises(SystemExit, match=r"^error: checkpoint '.*epoch_1\.pth' was trained on 5 classes "
                                         r"\['plane', 'ship', .*\], the data set has 15: \['plane', "
                                         r"'baseball-diamond', .*\] \(set the data set's metainfo"):
        main([TINY, osp.join(work_dir, 'epoch_1.pth'), *args])
    checkpoint = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu')
    torch.save({'state_dict': checkpoint['state_dict']}, tmp_path / 'no_meta.pth')  # classes not saved
    with pytest.raises(SystemExit, match=r"^error: the model predicts 5 classes \(bbox head num_classes\), "
                                         r"the data set has 15: \['plane', 'baseball-diamond'"):
        main([TINY, str(tmp_path / 'no_meta.pth'), *args])
    assert not osp.exists(tmp_path / 'w' / 'test_metrics.json')


def test_train_refuses_a_data_set_of_other_classes_than_the_model(tmp_path):
    from tools.train import main
    with pytest.raises(SystemExit, match=r"^error: the model predicts 5 classes .*, the data set has 15"):
        main([TINY, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(tmp_path / 'data'),
              f'train_dataloader.dataset.metainfo.classes={DOTA_CLASSES}'])


def test_tools_name_an_empty_data_set_in_one_line(demo_run, tmp_path):
    """mmengine failed with 'need at least one array to concatenate'."""
    from tools.test import main as test_main
    from tools.train import main as train_main
    _, work_dir, data_root = demo_run
    no_class = r"^error: DOTADataset: no annotations of the classes \['bridge'\] in '.*labelTxt/?': its objects"
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(SystemExit, match=no_class):
        train_main([TINY, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(data_root),
                    'train_dataloader.dataset.metainfo.classes=[bridge]'])
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(SystemExit, match=no_class):
        test_main([TINY, osp.join(work_dir, 'epoch_1.pth'), '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                   *_tiny_options(data_root, ('test_dataloader',)), 'test_dataloader.dataset.metainfo.classes=[bridge]'])


def test_train_refuses_loaders_that_give_one_folder_other_synthetic_parameters(tmp_path):
    """The val loader regenerated the folder under the train set's labels, silently."""
    from tools.train import main
    data_root = tmp_path / 'data'
    with pytest.raises(SystemExit, match=r"^error: SyntheticDOTADataset: '.*data/' is in use with the synthetic "
                                         r"parameters \{.*'image_size': 128.*\}; these are \{.*'image_size': 96"):
        main([TINY, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *_tiny_options(data_root),
              'train_dataloader.dataset.synthetic.image_size=128'])
    with open(data_root / 'synthetic_meta.json') as f:
        assert json.load(f)['image_size'] == 128  # the train set's images, as loaded


class _Stopped(Exception):
    """Raised instead of running tools/train.py: the tests below check what comes before."""


@pytest.fixture
def demo_main_until_train(monkeypatch, tmp_path):
    """scripts/demo_main.main with the repository root at tmp_path/repo, stopping at the train step."""
    import scripts.demo_main as demo_main

    def stop(step, args):
        raise _Stopped(args)
    monkeypatch.setattr(demo_main, 'ROOT', str(tmp_path / 'repo'))
    monkeypatch.setattr(demo_main, 'run', stop)
    return demo_main.main


def _full_run_in(work_dir, data_root):
    """A full run's work dir and data set, as far as demo_main.py can tell (with files of theirs)."""
    from redet_plugin.datasets.synthetic import synthetic_params
    os.makedirs(work_dir)
    os.makedirs(data_root)
    with open(osp.join(work_dir, 'demo_main.json'), 'w') as f:
        json.dump(dict(quick=False, config=TINY, cfg_options=[]), f)
    with open(osp.join(data_root, 'synthetic_meta.json'), 'w') as f:
        json.dump(synthetic_params(**Config.fromfile(TINY).train_dataloader.dataset.synthetic), f)
    for folder in (work_dir, data_root):
        with open(osp.join(folder, 'saved.txt'), 'w') as f:
            f.write('the full run')


def test_demo_main_quick_keeps_off_the_full_runs_folders(demo_main_until_train, tmp_path):
    """--quick used the full run's work dir and data root: it resumed the full model, wrote over
    its results and regenerated its data set."""
    repo = tmp_path / 'repo'
    _full_run_in(str(repo / 'work_dirs/demo'), str(repo / 'data/synthetic_dota'))
    with pytest.raises(_Stopped) as stopped:
        demo_main_until_train(['--quick', '--config', TINY])
    args = stopped.value.args[0]
    assert args[args.index('--work-dir') + 1] == str(repo / 'work_dirs/demo_quick')
    assert f'train_dataloader.dataset.data_root={repo}/data/synthetic_dota_quick/' in args
    assert len(os.listdir(repo / 'data/synthetic_dota_quick/train/images')) == 4
    assert sorted(os.listdir(repo / 'work_dirs/demo')) == ['demo_main.json', 'saved.txt']
    assert sorted(os.listdir(repo / 'data/synthetic_dota')) == ['saved.txt', 'synthetic_meta.json']


def test_demo_main_refuses_folders_of_another_run(demo_main_until_train, tmp_path):
    full_work, full_data = str(tmp_path / 'full_work'), str(tmp_path / 'full_data')
    _full_run_in(full_work, full_data)
    quick_data = str(tmp_path / 'quick_data')
    with pytest.raises(SystemExit, match=r'^error: --work-dir .*full_work holds a full run, this is a --quick '
                                         r'run \(see its demo_main.json\): give another --work-dir'):
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', full_work, '--data-root', quick_data])
    assert not osp.exists(quick_data)  # refused before generating anything
    with pytest.raises(SystemExit, match=r"^error: --data-root .*full_data/ holds a synthetic set made with "
                                         r"\{'num_train': 400, .*\}, this run needs \{'num_train': 4, "):
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', str(tmp_path / 'new'),
                               '--data-root', full_data])
    assert not osp.exists(tmp_path / 'new')
    with pytest.raises(_Stopped):  # a quick run of its own
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', str(tmp_path / 'quick_work'),
                               '--data-root', quick_data])
    with pytest.raises(SystemExit, match=r'quick_work holds a --quick run, this is a full run'):
        demo_main_until_train(['--config', TINY, '--work-dir', str(tmp_path / 'quick_work'),
                               '--data-root', str(tmp_path / 'other_data')])
    with pytest.raises(SystemExit, match=r'quick_work holds a run with other cfg_options'):
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', str(tmp_path / 'quick_work'),
                               '--data-root', quick_data, '--cfg-options', 'randomness.seed=1'])
    with pytest.raises(SystemExit, match=r'full_data is not empty and holds no run of the demo'):
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', full_data, '--data-root', quick_data])
    for folder in (full_work, full_data):
        with open(osp.join(folder, 'saved.txt')) as f:
            assert f.read() == 'the full run'


def test_demo_main_resumes_its_own_run(demo_run, demo_main_until_train):
    _, work_dir, data_root = demo_run
    with pytest.raises(_Stopped) as stopped:
        demo_main_until_train(['--quick', '--config', TINY, '--work-dir', work_dir, '--data-root', data_root])
    assert stopped.value.args[0][2:6] == ['--work-dir', work_dir, '--resume', 'auto']


@pytest.mark.parametrize('user_setting', [
    None, ('PYTORCH_CUDA_ALLOC_CONF', 'garbage_collection_threshold:0.8'),
    ('PYTORCH_ALLOC_CONF', 'max_split_size_mb:128')])
def test_tools_use_expandable_segments_unless_the_allocator_is_configured(user_setting,
                                                                          monkeypatch):
    from redet_plugin.engine.cli import use_expandable_segments
    names = ('PYTORCH_ALLOC_CONF', 'PYTORCH_CUDA_ALLOC_CONF')
    for name in names:
        monkeypatch.delenv(name, raising=False)
    if user_setting is not None:
        monkeypatch.setenv(*user_setting)
    use_expandable_segments()
    settings = {name: os.environ[name] for name in names if name in os.environ}
    if user_setting is not None:
        assert settings == dict([user_setting])
    else:
        assert list(settings.values()) == ['expandable_segments:True']


@pytest.mark.cuda
def test_this_torch_reads_the_expandable_segments_setting_without_a_warning():
    """In a fresh process (the allocator reads its settings once): the variable the tools set is
    the one this torch reads, and it does not warn that the name is deprecated."""
    env = {k: v for k, v in os.environ.items() if 'ALLOC_CONF' not in k}
    code = ('from redet_plugin.engine.cli import use_expandable_segments; '
            'use_expandable_segments(); '
            'import torch; torch.zeros(1, device="cuda"); '
            'print(torch.cuda.memory._snapshot()["allocator_settings"]["expandable_segments"])')
    env['PYTHONPATH'] = os.pathsep.join(p for p in (ROOT, env.get('PYTHONPATH')) if p)
    done = subprocess.run([sys.executable, '-c', code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == 'True'
    assert 'deprecated' not in done.stderr, done.stderr
