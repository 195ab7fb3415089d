"""RedetPeakMemoryHook writes the peaks (CUDA) or says there is no CUDA, keeps the largest peak
across mmengine's resets, and is found by name from mmdet's scope and, with the scope named, from
any other project's (mmrotate's configs)."""
import json
import os.path as osp

import pytest
import torch
from mmdet.registry import HOOKS
from mmengine.registry import HOOKS as ROOT_HOOKS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.engine import PeakMemoryHook, read_peaks


class Runner:
    def __init__(self, work_dir):
        self.work_dir = str(work_dir)


def test_registered_under_the_one_naming_scheme():
    assert HOOKS.get('RedetPeakMemoryHook') is PeakMemoryHook
    assert ROOT_HOOKS.get('mmdet.RedetPeakMemoryHook') is PeakMemoryHook
    assert 'PeakMemoryHook' not in HOOKS.module_dict
    assert 'PeakMemoryHook' not in ROOT_HOOKS.module_dict


@pytest.mark.parametrize("stage", ["after_train", "after_test"])
def test_hook_writes_the_peaks(tmp_path, stage):
    assert read_peaks(str(tmp_path)) is None
    getattr(HOOKS.build(dict(type='RedetPeakMemoryHook')), stage)(Runner(tmp_path))
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
    assert get_priority(PeakMemoryHook.priority) < get_priority(LoggerHook.priority)

    current = {}
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', lambda *a: current['mb'] * 2**20)
    monkeypatch.setattr(torch.cuda, 'max_memory_reserved', lambda *a: 2 * current['mb'] * 2**20)

    hook = HOOKS.build(dict(type='RedetPeakMemoryHook'))
    for batch_idx, mb in enumerate([500, 800, 300]):  # torch's peaks between two resets
        current['mb'] = mb
        hook.after_train_iter(Runner(tmp_path), batch_idx)
    hook.after_train(Runner(tmp_path))
    assert read_peaks(str(tmp_path)) == dict(cuda=True, allocated_mb=800, reserved_mb=1600)
