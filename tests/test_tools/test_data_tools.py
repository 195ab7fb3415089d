"""The data command-line tools, run in-process: make_synthetic_dota, dota_split, browse_dataset."""
import importlib.util
import os
import os.path as osp
import sys

import pytest

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

TOOLS = osp.join(osp.dirname(__file__), '..', '..', 'tools')


def run_tool(path, argv, monkeypatch):
    spec = importlib.util.spec_from_file_location('tool_under_test', osp.join(TOOLS, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, 'argv', [path] + argv)
    module.main()


def test_make_split_and_browse(tmp_path, monkeypatch):
    root = str(tmp_path / 'syn')
    run_tool('dataset_converters/make_synthetic_dota.py', [root, '--num-train', '2', '--num-val', '1', '--image-size', '96'],
             monkeypatch)
    assert sorted(os.listdir(osp.join(root, 'train', 'images'))) == ['train_00000.png', 'train_00001.png']
    run_tool('dataset_converters/dota_split.py', [osp.join(root, 'train'), str(tmp_path / 'split'), '--patch-size', '64',
                                    '--gap', '16'], monkeypatch)
    assert len(os.listdir(tmp_path / 'split' / 'images')) == 2 * 4  # 96 -> origins 0, 32 per axis
    assert len(os.listdir(tmp_path / 'split' / 'labelTxt')) == 8
    run_tool('analysis_tools/browse_dataset.py', ['--dota', osp.join(root, 'train'), '--output-dir', str(tmp_path / 'pics')],
             monkeypatch)
    assert sorted(os.listdir(tmp_path / 'pics')) == ['train_00000.png', 'train_00001.png']


def test_browse_dataset_from_config(tmp_path, monkeypatch):
    config = tmp_path / 'cfg.py'
    base = osp.abspath(osp.join(TOOLS, '..', 'configs', '_base_', 'datasets', 'synthetic_dota.py'))
    config.write_text(f"_base_ = [{base!r}]\ndefault_scope = 'mmdet'\n"
                      f"train_dataloader = dict(dataset=dict(data_root={str(tmp_path / 'syn')!r}, "
                      "synthetic=dict(num_train=2, num_val=1, image_size=96, progress=False)))\n")
    run_tool('analysis_tools/browse_dataset.py', [str(config), '--output-dir', str(tmp_path / 'pics'), '--max', '1'], monkeypatch)
    assert os.listdir(tmp_path / 'pics') == ['train_00000.png']


def test_browse_dataset_needs_config_or_folder(monkeypatch, tmp_path):
    with pytest.raises(SystemExit):
        run_tool('analysis_tools/browse_dataset.py', ['--output-dir', str(tmp_path)], monkeypatch)
