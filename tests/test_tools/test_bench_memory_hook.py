"""The detector benchmark's derived configs add PeakMemoryHook and keep their base config's
custom imports; the hook writes the peaks (CUDA) or says there is no CUDA."""
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import HOOKS

from benchmarks import bench_detector_vs_mmrotate as bench
from benchmarks.peak_memory_hook import read_peaks


def test_derived_configs_add_the_hook_and_keep_the_imports(tmp_path):
    args = bench.parse_args(['--out', str(tmp_path / 'r.json'), '--data-root', str(tmp_path)])
    paths = bench.bench_configs(args, str(tmp_path / 'configs'))
    ours = Config.fromfile(paths['ours'], import_custom_modules=False)
    assert ours.custom_imports['imports'] == ['redet_plugin.mm', 'benchmarks.peak_memory_hook']
    assert ours.custom_hooks == [dict(type='PeakMemoryHook')]
    if 'unreadable' not in str(bench.roi_layers(paths['mmrotate'])):  # (mmrotate installed)
        peer = Config.fromfile(paths['mmrotate'], import_custom_modules=False)
        assert peer.custom_imports['imports'] == ['benchmarks.peak_memory_hook']


@pytest.mark.parametrize("stage", ["after_train", "after_test"])
def test_hook_writes_the_peaks(tmp_path, stage):
    class Runner:
        work_dir = str(tmp_path)
    assert read_peaks(str(tmp_path)) is None
    getattr(HOOKS.build(dict(type='PeakMemoryHook')), stage)(Runner())
    with open(osp.join(tmp_path, 'peak_memory.json')) as f:
        peaks = json.load(f)
    assert peaks == read_peaks(str(tmp_path))
    assert peaks['cuda'] == torch.cuda.is_available()
    if peaks['cuda']:
        assert peaks['reserved_mb'] >= peaks['allocated_mb'] >= 0


def test_hook_keeps_the_largest_peak_across_mmengine_resets(tmp_path, monkeypatch):
    """mmengine's log processor resets torch's peaks at every log, so the hook must keep the
    largest it read; it reads before the LoggerHook does."""
    from mmengine.hooks import LoggerHook
    from mmengine.runner import get_priority
    assert get_priority(HOOKS.get('PeakMemoryHook').priority) < get_priority(LoggerHook.priority)

    current = {}
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', lambda *a: current['mb'] * 2**20)
    monkeypatch.setattr(torch.cuda, 'max_memory_reserved', lambda *a: 2 * current['mb'] * 2**20)

    class Runner:
        work_dir = str(tmp_path)
    hook = HOOKS.build(dict(type='PeakMemoryHook'))
    for batch_idx, mb in enumerate([500, 800, 300]):  # torch's peaks between two resets
        current['mb'] = mb
        hook.after_train_iter(Runner(), batch_idx)
    hook.after_train(Runner())
    assert read_peaks(str(tmp_path)) == dict(cuda=True, allocated_mb=800, reserved_mb=1600)
