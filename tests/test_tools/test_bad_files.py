"""Bad inputs to tools/train.py and tools/test.py: an image that cannot be read, an annotation
line that cannot be used, classes that match no object, a checkpoint that is cut short or is not
one. Each stops the tool with one line naming the file (never a traceback, also not from a data
loader worker), or, for images with on_bad_image='skip', is left out and listed at the end."""
import glob
import os
import os.path as osp
import pickle
import shutil
import sys

import pytest
import torch
from mmengine.config import Config

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (SYNTHETIC_CLASSES, ensure_synthetic_dota, generate_synthetic_dior,
                                   generate_synthetic_hrsc)
from tests._helpers import own_logger

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
sys.path.insert(0, ROOT)
SYNTHETIC = dict(num_train=4, num_val=2, image_size=96, seed=0)
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


@pytest.fixture(scope='module')
def made_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('synthetic') / 'data')
    ensure_synthetic_dota(root, progress=False, **SYNTHETIC)
    return root


@pytest.fixture
def data_root(made_data, tmp_path):
    root = str(tmp_path / 'data')
    shutil.copytree(made_data, root)
    return root


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    """The tiny model's initial weights, as a checkpoint of the synthetic classes."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    model = MODELS.build(Config.fromfile(TINY).model)
    path = str(tmp_path_factory.mktemp('checkpoint') / 'tiny.pth')
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': SYNTHETIC_CLASSES}}}, path)
    return path


def options(data_root, workers=0, loaders=LOADERS):
    found = ['train_cfg.max_epochs=1', 'train_cfg.val_interval=10', 'default_hooks.logger.interval=1']
    for loader in loaders:
        found += [f'{loader}.dataset.data_root={data_root}/', f'{loader}.num_workers={workers}',
                  f'{loader}.persistent_workers=False',
                  *(f'{loader}.dataset.synthetic.{k}={v}' for k, v in SYNTHETIC.items())]
    return found


def train(tmp_path, *cfg_options, config=TINY):
    from tools.train import main
    main([config, '--work-dir', str(tmp_path / 'work'), '--cfg-options', own_logger('bad-files'),
          *cfg_options])


def run_test(tmp_path, checkpoint, *cfg_options):
    from tools.test import main
    return main([TINY, checkpoint, '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                 own_logger('bad-files'), *cfg_options])


def one_line_error(capfd, run, match):
    """The tool stops with `error: <match>` in one line, and no traceback reaches the terminal."""
    with pytest.raises(SystemExit) as stopped:
        run()
    message = str(stopped.value.code)
    assert '\n' not in message, message
    assert __import__('re').search(match, message), message
    out, err = capfd.readouterr()
    assert 'Traceback' not in out + err
    return message


def break_pixels(path):
    """A PNG whose ends (signature, IEND) are whole but whose image data is damaged: found when
    a loader decodes it, not when the data set is listed."""
    with open(path, 'rb') as f:
        data = bytearray(f.read())
    start = data.index(b'IDAT') + 8
    data[start:start + 64] = bytes(64)
    with open(path, 'wb') as f:
        f.write(bytes(data))


@pytest.mark.parametrize('workers', [0, 2])
def test_train_names_an_image_that_fails_to_decode(workers, data_root, tmp_path, capfd):
    bad = osp.join(data_root, 'train', 'images', 'train_00002.png')
    break_pixels(bad)
    one_line_error(capfd, lambda: train(tmp_path, *options(data_root, workers)),
                   rf"^error: SyntheticDOTADataset: image '{bad}' cannot be read: its image data cannot be "
                   rf"decoded \(.*\) \(on_bad_image='skip' leaves such images out\)$")


@pytest.mark.parametrize('damage, reason', [
    (lambda path: open(path, 'wb').close(), r'the file is empty \(0 bytes\)'),
    (lambda path: os.truncate(path, os.path.getsize(path) // 2), r'the PNG is cut short'),
])
def test_train_and_test_name_an_empty_or_cut_image_before_they_start(damage, reason, data_root, tmp_path,
                                                                    checkpoint, capfd):
    damage(osp.join(data_root, 'train', 'images', 'train_00001.png'))
    damage(osp.join(data_root, 'val', 'images', 'val_00000.png'))
    one_line_error(capfd, lambda: train(tmp_path, *options(data_root)),
                   rf"^error: SyntheticDOTADataset: image '.*train_00001\.png' cannot be read: {reason}")
    one_line_error(capfd, lambda: run_test(tmp_path, checkpoint, *options(data_root, 2, ('test_dataloader',))),
                   rf"^error: SyntheticDOTADataset: image '.*val_00000\.png' cannot be read: {reason}")
    assert not osp.exists(tmp_path / 'work' / 'epoch_1.pth')


def test_train_with_skip_leaves_bad_images_out_and_lists_them(data_root, tmp_path, capfd):
    """One image found when listed (empty), one when a worker decodes it."""
    open(osp.join(data_root, 'train', 'images', 'train_00000.png'), 'wb').close()
    break_pixels(osp.join(data_root, 'train', 'images', 'train_00003.png'))
    train(tmp_path, *options(data_root, 2), 'train_dataloader.dataset.on_bad_image=skip')
    assert osp.isfile(tmp_path / 'work' / 'epoch_1.pth')
    listed, = glob.glob(str(tmp_path / 'work' / '*' / 'skipped_images.txt'))
    with open(listed) as f:
        entries = f.read().splitlines()
    assert [osp.basename(e.split(':')[0]) for e in entries] == ['train_00000.png', 'train_00003.png'], entries
    assert 'the file is empty' in entries[0] and 'cannot be decoded' in entries[1]
    out, _ = capfd.readouterr()
    assert "2 unreadable images left out of the training (on_bad_image='skip')" in out


def test_test_names_an_image_that_fails_to_decode_in_a_worker(data_root, tmp_path, checkpoint, capfd):
    break_pixels(osp.join(data_root, 'val', 'images', 'val_00001.png'))
    one_line_error(capfd, lambda: run_test(tmp_path, checkpoint, *options(data_root, 2, ('test_dataloader',))),
                   r"^error: SyntheticDOTADataset: image '.*val_00001\.png' cannot be read: its image "
                   r"data cannot be decoded")


def test_test_with_skip_leaves_an_unreadable_image_out_and_lists_it(data_root, tmp_path, checkpoint, capfd):
    open(osp.join(data_root, 'val', 'images', 'val_00001.png'), 'wb').close()
    metrics = run_test(tmp_path, checkpoint, *options(data_root, 0, ('test_dataloader',)),
                   'test_dataloader.dataset.on_bad_image=skip')
    assert 'dota/mAP' in metrics
    out, _ = capfd.readouterr()
    assert "1 unreadable image left out of the test (on_bad_image='skip'):" in out
    assert 'val_00001.png: the file is empty' in out


@pytest.mark.parametrize('line, reason', [
    ('10 10 40 10 40 30 10', r"expected 'x1 y1 x2 y2 x3 y3 x4 y4 class \[difficulty\]' \(9 or 10 fields\), got 7"),
    ('10 10 40 ten 40 30 10 30 plane 0', 'coordinates must be numbers'),
    ('10 10 40 10 nan 30 10 30 plane 0', 'coordinates must be finite'),
    ('10 10 40 10 inf 30 10 30 plane 0', 'coordinates must be finite'),
    ('10 10 40 10 70 10 100 10 plane 0', r'degenerate polygon \(zero area\)'),
])
def test_train_names_the_file_and_line_of_a_bad_annotation(line, reason, data_root, tmp_path, capfd):
    label = osp.join(data_root, 'train', 'labelTxt', 'train_00002.txt')
    with open(label) as f:
        number = len(f.readlines()) + 1
    with open(label, 'a') as f:
        f.write(line + '\n')
    one_line_error(capfd, lambda: train(tmp_path, *options(data_root)),
                   rf"^error: .*train_00002\.txt, line {number}: {reason}")


def _dataset_config(tmp_path, dataset, classes):
    """The tiny config whose training set is `dataset` (a dict), with `classes`."""
    path = tmp_path / 'other_set.py'
    path.write_text(f'_base_ = {TINY!r}\n'
                    f'train_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(\n'
                    f'    _delete_=True, metainfo=dict(classes={tuple(classes)!r}),\n'
                    f'    pipeline=_base_.train_pipeline, **{dataset!r}))\n')
    return str(path)


@pytest.mark.parametrize('kind', ['hrsc', 'dior', 'dota_v2'])
def test_classes_that_match_no_object_are_one_line(kind, tmp_path, made_data, capfd):
    data = str(tmp_path / kind)
    if kind == 'hrsc':
        generate_synthetic_hrsc(data, num_trainval=2, num_test=1, image_size=64)
        dataset = dict(type='RedetHRSCDataset', data_root=data, ann_file='ImageSets/trainval.txt',
                       data_prefix=dict(sub_data_root='FullDataSet/'), classwise=True)
        classes, owner = ('Kitty Hawk',), 'HRSCDataset'
    elif kind == 'dior':
        generate_synthetic_dior(data, num_trainval=2, num_test=1, image_size=64)
        dataset = dict(type='RedetDIORDataset', data_root=data, ann_file='ImageSets/Main/train.txt',
                       data_prefix=dict(img_path='JPEGImages-trainval'))
        classes, owner = ('dam',), 'DIORDataset'
    else:
        dataset = dict(type='RedetDOTAv2Dataset', data_root=made_data + '/', ann_file='train/labelTxt/',
                       data_prefix=dict(img_path='train/images/'))
        classes, owner = ('helipad',), 'DOTADataset'
    config = _dataset_config(tmp_path, dataset, classes)
    with pytest.warns(UserWarning):  # (the objects of the other classes are left out, with a warning)
        one_line_error(capfd, lambda: train(tmp_path, 'train_cfg.max_epochs=1', config=config),
                       rf"^error: {owner}: no annotations of the classes \[{classes[0]!r}\] in ")


# ---- checkpoints ----------------------------------------------------------------------------------
class _Payload:
    """Unpickled, it would leave a file behind."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def _cut(source, target):
    with open(source, 'rb') as f:
        data = f.read()
    with open(target, 'wb') as f:
        f.write(data[:len(data) // 2])
    return target


@pytest.mark.parametrize('how', ['resume', 'load_from'])
@pytest.mark.parametrize('bad', ['cut', 'empty', 'text', 'pickle', 'objects'])
def test_train_refuses_a_bad_checkpoint_in_one_line_without_unpickling_it(how, bad, checkpoint, data_root,
                                                                         tmp_path, capfd):
    path = str(tmp_path / f'{bad}.pth')
    marker = str(tmp_path / 'unpickled')
    if bad == 'cut':
        _cut(checkpoint, path)
        reason = r"cannot be read: the file is cut short or damaged \(PytorchStreamReader failed"
    elif bad == 'empty':
        open(path, 'wb').close()
        reason = 'cannot be read: the file is empty'
    elif bad == 'text':
        with open(path, 'w') as f:
            f.write('model weights: see the release page\n')
        reason = r'is not a torch checkpoint \((torch.load cannot read it|torch\'s weights-only reader)'
    elif bad == 'pickle':  # a plain pickle, not torch's format
        with open(path, 'wb') as f:
            pickle.dump({'state_dict': _Payload(marker)}, f)
        reason = r"is not a torch checkpoint \(torch's weights-only reader refuses it: a plain pickle"
    else:  # torch's format, holding an object that is not a weight
        torch.save({'state_dict': {}, 'meta': _Payload(marker)}, path)
        reason = r'is refused: it holds Python objects other than weights \((builtins|_?io)\.open\)'  # (open's module: _io on Python 3.12)
    args = ['--resume', path] if how == 'resume' else []
    from tools.train import main
    one_line_error(capfd, lambda: main([TINY, '--work-dir', str(tmp_path / 'work'), *args, '--cfg-options',
                                        own_logger('bad-files'), *options(data_root),
                                        *([f'load_from={path}'] if how == 'load_from' else [])]),
                   rf"^error: checkpoint '{path}' {reason}")
    assert not osp.exists(marker)  # nothing of the file ran


def test_test_refuses_a_cut_checkpoint_in_one_line(checkpoint, data_root, tmp_path, capfd):
    path = _cut(checkpoint, str(tmp_path / 'cut.pth'))
    one_line_error(capfd, lambda: run_test(tmp_path, path, *options(data_root, 0, ('test_dataloader',))),
                   rf"^error: checkpoint '{path}' cannot be read: the file is cut short or damaged")


def test_the_tools_load_users_checkpoints_weights_only():
    """Every torch.load of tools/, scripts/ and redet_plugin/ passes weights_only=True."""
    import re
    calls = []
    for folder in ('tools', 'scripts', 'redet_plugin'):
        for path in glob.glob(osp.join(ROOT, folder, '**', '*.py'), recursive=True):
            with open(path) as f:
                text = f.read()
            calls += [(path, m.group(0)) for m in re.finditer(r'torch\.load\([^)]*\)', text)]
    assert calls
    for path, call in calls:
        assert 'weights_only=True' in call, (path, call)


@pytest.mark.parametrize('how', ['load_from', 'resume', 'test'])
def test_the_tools_read_a_checkpoint_once_weights_only(how, checkpoint, data_root, tmp_path, monkeypatch):
    """The Runner's read is the only one: the check works on what it read."""
    if how == 'resume':  # a checkpoint of a run, to resume for one more epoch
        train(tmp_path, *options(data_root))
        path = str(tmp_path / 'work' / 'epoch_1.pth')
    else:
        path = checkpoint
    reads, real_load = [], torch.load

    def counted_load(f, *args, **kwargs):
        reads.append((str(f), kwargs.get('weights_only')))
        return real_load(f, *args, **kwargs)
    monkeypatch.setattr(torch, 'load', counted_load)
    if how == 'test':
        run_test(tmp_path, path, *options(data_root, 0, ('test_dataloader',)))
    elif how == 'resume':
        from tools.train import main
        main([TINY, '--work-dir', str(tmp_path / 'work'), '--resume', path, '--cfg-options',
              own_logger('bad-files'), *options(data_root), 'train_cfg.max_epochs=2'])
    else:
        train(tmp_path, *options(data_root), f'load_from={path}')
    assert [read for read in reads if read[0] == path] == [(path, True)]
