"""The benchmark configs of the other data sets end to end on the CPU, each on a small generated
set in its own layout: HRSC2016 (redet-le90_re50_refpn_3x_hrsc.py), DOTA-v1.5 (..._1x_dota15.py),
DOTA-v2.0 (..._1x_dota2.py) and DIOR-R (..._1x_dior.py).

Each case writes a config whose _base_ is the real one, with the tiny model's sizes (the numbers
of configs/redet/redet-le90_re18_refpn_tiny-synthetic.py put into the real model, which keeps its
classes, RoI layers, coders and losses), 256² images and one process; trains two iterations
through tools/train.py and evaluates on the generated test split through tools/test.py, with the
config's own data set classes, evaluator and schedule (one epoch). A second test checks that the
shrinking keeps those from the real config.

The data come from tools/dataset_converters/make_synthetic_dota.py (--layout hrsc / dior / dota); the DOTA sets
get objects of the classes that only DOTA-v1.5 and v2.0 have by renaming classes in the generated
labelTxt files."""
import copy
import glob
import importlib.util
import os.path as osp
import re
import shlex
import sys

import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import DIOR_CLASSES, DOTA_V2_CLASSES, DOTA_V15_CLASSES

from tests._helpers import REPO, own_logger

sys.path.insert(0, REPO)
TINY = osp.join(REPO, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
SIZE = 256  # generated images and the pipelines' Resize
NUM_TRAIN, NUM_TEST = 4, 2  # two iterations of the configs' batch of 2; two test images

HRSC_METRICS = {'hrsc_voc07/AP50', 'hrsc_voc07/AP75', 'hrsc_voc07/mAP', 'hrsc_voc12/AP50'}
DOTA_METRICS = {'dota/mAP', 'dota/AP50'}
# config -> (layout, classes renamed in the generated DOTA labels, the data set's classes,
#            the metrics tools/test.py must return, the difficult rule its metric logs)
CASES = {
    'redet-le90_re50_refpn_3x_hrsc.py': ('hrsc', {}, ('ship',), HRSC_METRICS, 'kept as ground truth (mmrotate)'),
    'redet-le90_re50_refpn_1x_dota15.py': ('dota', {'tennis-court': 'container-crane'}, DOTA_V15_CLASSES,
                                           DOTA_METRICS, 'ignored (DOTA devkit)'),
    'redet-le90_re50_refpn_1x_dota2.py': ('dota', {'tennis-court': 'container-crane', 'storage-tank': 'helipad'},
                                          DOTA_V2_CLASSES, DOTA_METRICS, 'ignored (DOTA devkit)'),
    'redet-le90_re50_refpn_1x_dior.py': ('dior', {}, DIOR_CLASSES, DOTA_METRICS,
                                         'kept as ground truth (mmrotate)'),
}


def real_config(name):
    return osp.join(REPO, 'configs/redet', name)


def load_tool(path):
    spec = importlib.util.spec_from_file_location('tool_under_test', osp.join(REPO, 'tools', path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_data(root, layout, renames):
    """tools/dataset_converters/make_synthetic_dota.py --layout LAYOUT; in the DOTA layout, the objects of each
    class in `renames` get the new class name (train and val labels)."""
    argv = ['make_synthetic_dota.py', str(root), '--layout', layout, '--num-train', str(NUM_TRAIN),
            '--num-val', str(NUM_TEST), '--image-size', str(SIZE)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, 'argv', argv)
        load_tool('dataset_converters/make_synthetic_dota.py').main()
    renamed = set()
    for txt in glob.glob(osp.join(root, '*', 'labelTxt', '*.txt')):
        with open(txt) as f:
            lines = [line.split() for line in f if line.strip()]
        for fields in lines:
            if len(fields) == 10 and fields[8] in renames:
                fields[8] = renames[fields[8]]
                renamed.add((osp.basename(osp.dirname(osp.dirname(txt))), fields[8]))
        with open(txt, 'w') as f:
            f.write(''.join(' '.join(fields) + '\n' for fields in lines))
    for name in renames.values():  # the new classes are in the training set
        assert ('train', name) in renamed, f'no {name!r} object in the generated training images'


# --- the tiny model's sizes, put into the real model -------------------------------------------------

def tiny_sizes(real_model, tiny_model):
    """(path, value) of every size the tiny config gives its model: the only keys that change."""
    roi, tiny_roi = real_model['roi_head'], tiny_model['roi_head']
    sizes = [(('backbone', key), tiny_model['backbone'][key]) for key in ('depth', 'base_channels', 'frozen_stages')]
    sizes += [(('neck', key), tiny_model['neck'][key]) for key in ('in_channels', 'out_channels')]
    sizes += [(('rpn_head', key), tiny_model['rpn_head'][key]) for key in ('in_channels', 'feat_channels')]
    sizes.append((('rpn_head', 'anchor_generator', 'scales'), tiny_model['rpn_head']['anchor_generator']['scales']))
    for i in range(len(roi['bbox_roi_extractor'])):
        sizes.append((('roi_head', 'bbox_roi_extractor', i, 'out_channels'),
                      tiny_roi['bbox_roi_extractor'][i]['out_channels']))
    for i in range(len(roi['bbox_head'])):
        sizes += [(('roi_head', 'bbox_head', i, key), tiny_roi['bbox_head'][i][key])
                  for key in ('in_channels', 'fc_out_channels')]
    for i in range(len(real_model['train_cfg']['rcnn'])):
        sizes.append((('train_cfg', 'rcnn', i, 'sampler', 'num'), tiny_model['train_cfg']['rcnn'][i]['sampler']['num']))
    for stage, key in (('train_cfg', 'rpn_proposal'), ('test_cfg', 'rpn'), ('test_cfg', 'rcnn')):
        sizes += [((stage, key, name), tiny_model[stage][key][name]) for name in ('nms_pre', 'max_per_img')]
    return sizes


def shrink_model(real_model, tiny_model):
    model = copy.deepcopy(real_model)
    for path, value in tiny_sizes(real_model, tiny_model):
        node = model
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = copy.deepcopy(value)
    return model


def shrink_dataset(dataset, data_root):
    """The config's data set on `data_root`, its images resized to SIZE²."""
    dataset = copy.deepcopy(dataset)
    if dataset['type'] == 'ConcatDataset':  # DIOR-R trains on train + val
        dataset['datasets'] = [shrink_dataset(d, data_root) for d in dataset['datasets']]
        return dataset
    dataset['data_root'] = data_root
    dataset['pipeline'] = [dict(t, scale=(SIZE, SIZE)) if t['type'] == 'Resize' else t for t in dataset['pipeline']]
    return dataset


def write_shrunk_config(path, name, data_root='data/'):
    """A config of `_base_ = [the real config]` with the tiny model's sizes, SIZE² images, data
    under data_root and loaders in this process. The DOTA configs' test loader is the unlabelled
    test set (Task1 files only): there the labelled val split is the test set, scored with the
    config's val_evaluator. data_root is short and relative, as in the real configs."""
    real, tiny = Config.fromfile(real_config(name)), Config.fromfile(TINY)
    model = shrink_model(real.model.to_dict(), tiny.model.to_dict())
    one_process = dict(num_workers=0, persistent_workers=False, pin_memory=False)
    train = dict(one_process, dataset=shrink_dataset(real.train_dataloader.dataset.to_dict(), data_root))
    val = dict(one_process, dataset=shrink_dataset(real.val_dataloader.dataset.to_dict(), data_root))
    if real.test_evaluator != real.val_evaluator:
        test_loader = dict(real.val_dataloader.to_dict(), _delete_=True, **val)
        test_evaluator = real.val_evaluator
        test_evaluator = (test_evaluator.to_dict() if hasattr(test_evaluator, 'to_dict')
                          else [e.to_dict() for e in test_evaluator])
        if isinstance(test_evaluator, dict):
            test_evaluator = dict(test_evaluator, _delete_=True)
    else:
        test_loader = dict(one_process, dataset=shrink_dataset(real.test_dataloader.dataset.to_dict(), data_root))
        test_evaluator = None
    text = f'''_base_ = [{real_config(name)!r}]
# the real model with the tiny model's sizes ({osp.basename(TINY)})
model = dict(_delete_=True, **{model!r})
train_dataloader = {train!r}
val_dataloader = {val!r}
test_dataloader = {test_loader!r}
default_hooks = dict(logger=dict(interval=1))
# mmengine keeps one visualizer per name in the process: a name of this run's own, so that its
# scalars go to its own work dir
visualizer = dict(name={'visualizer_' + osp.basename(osp.dirname(str(path)))!r})
'''
    if test_evaluator is not None:
        text += f'test_evaluator = {test_evaluator!r}\n'
    path.write_text(text)
    return str(path)


def flatten(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from flatten(value, prefix + (key,))
    elif isinstance(node, (list, tuple)) and any(isinstance(v, dict) for v in node):
        for i, value in enumerate(node):
            yield from flatten(value, prefix + (i,))
    else:
        yield prefix, node


def datasets_of(loader):
    dataset = loader.dataset
    return list(dataset.datasets) if dataset.type == 'ConcatDataset' else [dataset]


@pytest.mark.parametrize('name', list(CASES))
def test_shrinking_keeps_the_configs_data_set_classes_evaluator_and_schedule(name, tmp_path):
    real = Config.fromfile(real_config(name))
    shrunk = Config.fromfile(write_shrunk_config(tmp_path / 'shrunk.py', name))
    tiny = Config.fromfile(TINY)
    layout, _, classes, _, _ = CASES[name]
    # the model: the real one but for the tiny model's sizes
    sizes = dict(tiny_sizes(real.model.to_dict(), tiny.model.to_dict()))
    real_model, shrunk_model = dict(flatten(real.model.to_dict())), dict(flatten(shrunk.model.to_dict()))
    changed = {path for path in real_model.keys() | shrunk_model.keys()
               if real_model.get(path, 'absent') != shrunk_model.get(path, 'absent')}
    assert changed and changed <= set(sizes), sorted(changed - set(sizes), key=str)
    assert shrunk.model.backbone.depth == 18 and shrunk.model.neck.out_channels == tiny.neck_channels
    heads = [head.num_classes for head in shrunk.model.roi_head.bbox_head]
    assert heads == [head.num_classes for head in real.model.roi_head.bbox_head] == [len(classes)] * 2
    assert ([e.roi_layer for e in shrunk.model.roi_head.bbox_roi_extractor]
            == [e.roi_layer for e in real.model.roi_head.bbox_roi_extractor])
    assert shrunk.model.roi_head.bbox_roi_extractor[0].roi_layer.type == 'RoIAlign'  # as mmrotate
    # the data sets: type, classes, files and rules as the real config's; only where and how large
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        real_sets = datasets_of(real[loader] if loader != 'test_dataloader' or layout != 'dota'
                                else real.val_dataloader)
        shrunk_sets = datasets_of(shrunk[loader])
        assert [d.type for d in shrunk_sets] == [d.type for d in real_sets]
        for real_set, shrunk_set in zip(real_sets, shrunk_sets):
            assert shrunk_set.data_root == 'data/'
            for key in set(real_set) | set(shrunk_set):
                if key not in ('data_root', 'pipeline'):
                    assert shrunk_set.get(key) == real_set.get(key), (loader, key)
            assert ([t.type for t in shrunk_set.pipeline] == [t.type for t in real_set.pipeline])
        assert shrunk[loader].batch_size == real[loader].batch_size
    from mmdet.registry import DATASETS
    dataset_type = datasets_of(shrunk.train_dataloader)[0].type
    assert dataset_type == {'hrsc': 'RedetHRSCDataset', 'dior': 'RedetDIORDataset'}.get(
        layout, real.train_dataloader.dataset.type)
    if layout != 'hrsc':  # (HRSC: classwise=False, one class 'ship' of the 31)
        assert tuple(DATASETS.get(dataset_type).METAINFO['classes']) == tuple(classes)
    # the evaluators: the config's (for DOTA, its val_evaluator scores the labelled split)
    assert shrunk.val_evaluator == real.val_evaluator
    assert shrunk.test_evaluator == (real.val_evaluator if layout == 'dota' else real.test_evaluator)
    # the schedule
    for key in ('train_cfg', 'val_cfg', 'test_cfg', 'param_scheduler', 'optim_wrapper', 'auto_scale_lr'):
        assert shrunk[key] == real[key], key


@pytest.mark.parametrize('name', list(CASES))
def test_train_and_test_on_a_generated_set_in_the_configs_layout(name, tmp_path, monkeypatch):
    from mmdet.registry import DATASETS
    from tools.test import main as test_main
    from tools.train import main as train_main
    layout, renames, classes, metric_names, difficult_rule = CASES[name]
    monkeypatch.chdir(tmp_path)  # data/, work/ and test/ in here, by relative paths
    make_data('data', layout, renames)
    config = write_shrunk_config(tmp_path / 'shrunk.py', name, 'data/')

    # the data set loads the generated set under the config's class table
    cfg = Config.fromfile(config)
    with DefaultScope.overwrite_default_scope('mmdet'):
        train_set = DATASETS.build(cfg.train_dataloader.dataset)
        assert tuple(train_set.metainfo['classes']) == tuple(classes)
        labels = {inst['bbox_label'] for i in range(len(train_set))
                  for inst in train_set.get_data_info(i)['instances']}
    assert len(train_set) == NUM_TRAIN
    assert {classes.index(c) for c in renames.values()} <= labels

    work_dir = 'work'
    train_main([config, '--work-dir', work_dir, '--cfg-options', 'train_cfg.max_epochs=1',
                own_logger('train')])
    with open(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))[0]) as f:
        assert sum('"loss"' in line for line in f) == 2  # two iterations (batch 2 of 4 images)
    checkpoint = osp.join(work_dir, 'epoch_1.pth')
    assert osp.isfile(checkpoint)

    test_dir = 'test'
    metrics = test_main([config, checkpoint, '--work-dir', test_dir, '--cfg-options',
                         own_logger('test')])
    assert metric_names <= set(metrics), sorted(metrics)
    prefixes = {key.split('/')[0] for key in metric_names}
    assert {key.split('/')[0] for key in metrics} == prefixes
    assert all(0.0 <= value <= 1.0 for value in metrics.values()), metrics
    logs = glob.glob(osp.join(test_dir, '*', '*.log'))
    with open(logs[0]) as f:
        log = f.read()
    assert f'difficult objects: {difficult_rule}' in log
    assert f'Epoch(test) [{NUM_TEST}/{NUM_TEST}]' in log  # every generated test image


# --- docs/data.md: the data set table and the commands for trying the configs -----------------------

def data_doc_section():
    with open(osp.join(REPO, 'docs/data.md')) as f:
        return f.read().split('## Supported data sets')[1].split('\n## ')[0]


def table_rows():
    """(data set, prepare cell, config names) of each row of the data set table."""
    rows = []
    for line in data_doc_section().splitlines():
        cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
        if len(cells) != 8 or cells[0] in ('data set', '---'):
            continue
        configs = [name.replace('...', 'redet-le90_re50_refpn') for name in
                   re.findall(r'`((?:redet-le90_re50_refpn|\.\.\.)[\w.-]*\.py)`', cells[4])]
        rows.append((cells[0], cells[3], configs))
    return rows


def test_data_doc_table_names_every_data_set_and_existing_configs():
    rows = table_rows()
    assert [r[0].split(' (')[0] for r in rows] == ['DOTA-v1.0', 'DOTA-v1.0, multi-scale + rotation', 'DOTA-v1.5',
                                                  'DOTA-v1.5, multi-scale + rotation',
                                                  'DOTA-v2.0', 'HRSC2016', 'DIOR-R']
    named = {name for _, _, configs in rows for name in configs}
    assert set(CASES) | {'redet-le90_re50_refpn_1x_dota.py', 'redet-le90_re50_refpn_rr-1x_dota-ms.py',
                        'redet-le90_re50_refpn_rr-1x_dota15-ms.py'} <= named
    for name in named:
        assert osp.isfile(real_config(name)), name


def test_data_doc_preparation_commands_write_where_the_configs_read():
    tool = load_tool('dataset_converters/dota_split.py')
    for data_set, prepare, configs in table_rows():
        cfg = Config.fromfile(real_config(configs[0]))
        commands = re.findall(r'`(python tools/dataset_converters/dota_split.py [^`]*)`', prepare)
        if data_set.startswith(('HRSC2016', 'DIOR-R')):
            assert not commands and prepare == 'none'
            continue
        assert commands, data_set
        for command in commands:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, 'argv', shlex.split(command)[1:])
                args = tool.parse_args()
            split = osp.relpath(args.dst, cfg.data_root)
            assert cfg.train_dataloader.dataset.ann_file == f'{split}/labelTxt/', (data_set, command)
            assert osp.basename(args.src) == 'train'
            multi_scale = 'multi-scale' in data_set
            assert (args.patch_size, args.gap, args.rates) == ((1024, 500, [0.5, 1.0, 1.5]) if multi_scale
                                                               else (1024, 200, [1.0]))


def doc_commands(program):
    """The shell commands of docs/data.md's examples that run `program`, continuation lines joined."""
    lines = [line.strip() for line in data_doc_section().splitlines() if line.startswith('    ')]
    commands, current = [], ''
    for line in lines:
        current += ' ' + line.rstrip('\\').strip()
        if not line.endswith('\\'):
            commands.append(current.split('#')[0].strip())
            current = ''
    return [shlex.split(c) for c in commands if c.startswith(f'python {program}')]


def test_data_doc_synthetic_commands_point_each_config_at_the_generated_set():
    from redet_plugin.engine.cli import load_config
    from tools.train import parse_args
    generated = {}
    for words in doc_commands('tools/dataset_converters/make_synthetic_dota.py'):
        layout = words[words.index('--layout') + 1] if '--layout' in words else 'dota'
        generated[osp.normpath(words[2])] = layout
    runs = doc_commands('tools/train.py')
    assert {osp.basename(words[2]) for words in runs} == set(CASES) - {'redet-le90_re50_refpn_1x_dota2.py'}
    for words in runs:
        cfg = load_config(parse_args([real_config(osp.basename(words[2])), *words[3:]]))
        layout = CASES[osp.basename(words[2])][0]
        loaders = ('train_dataloader', 'val_dataloader') + (('test_dataloader',) if layout != 'dota' else ())
        roots = {osp.normpath(d.data_root) for loader in loaders for d in datasets_of(cfg[loader])}
        assert len(roots) == 1 and generated[roots.pop()] == layout, words
        assert cfg.train_cfg.max_epochs == 1


def test_submission_files_of_each_data_set_go_to_a_folder_of_their_own():
    """Configs that write Task1 files for different data sets never share a folder: a DOTA-v1.5
    test run must not overwrite DOTA-v1.0's submission."""
    prefixes = {}
    for path in sorted(glob.glob(osp.join(REPO, 'configs/redet/*.py'))):
        cfg = Config.fromfile(path, import_custom_modules=False)
        evaluator = cfg.get('test_evaluator')
        if not isinstance(evaluator, dict) or not evaluator.get('format_only'):
            continue
        prefixes.setdefault(evaluator['outfile_prefix'], set()).add(
            cfg.test_dataloader.dataset.type)
    assert prefixes, 'no config writes submission files'
    shared = {prefix: types for prefix, types in prefixes.items() if len(types) > 1}
    assert not shared, f'one outfile_prefix for several data sets: {shared}'
