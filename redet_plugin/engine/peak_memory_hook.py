"""PeakMemoryHook (registered as 'RedetPeakMemoryHook'): writes the CUDA peak of allocated *and
reserved* memory of a training or test run to <work_dir>/peak_memory.json. mmengine logs only the
allocated peak, and a CUDA graph's activations live in its private pool, which stays reserved (not
allocated) between replays: the reserved peak is the footprint that compares runs with and without
graphs. In a config: custom_hooks = [dict(type='RedetPeakMemoryHook')] (from a config whose
default scope is not mmdet, e.g. mmrotate's: type='mmdet.RedetPeakMemoryHook').

mmengine's log processor resets torch's peak statistics each time it logs memory
(mmengine.device.get_max_cuda_memory), so torch's peaks only cover the last logged window. The
hook therefore reads them after every iteration, before the LoggerHook (priority NORMAL runs
before its BELOW_NORMAL), and keeps the largest."""
import json
import os.path as osp

import torch
from mmdet.registry import HOOKS
from mmengine.dist import master_only
from mmengine.hooks import Hook

from ..utils.registration import register

FILE_NAME = 'peak_memory.json'


@register(HOOKS)
class PeakMemoryHook(Hook):
    priority = 'NORMAL'

    def __init__(self):
        self._peaks = dict(allocated=0, reserved=0)

    def _read(self):
        if torch.cuda.is_available():  # (the process's default device: one GPU per process)
            self._peaks['allocated'] = max(self._peaks['allocated'], torch.cuda.max_memory_allocated())
            self._peaks['reserved'] = max(self._peaks['reserved'], torch.cuda.max_memory_reserved())

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._read()

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._read()

    def after_train(self, runner):
        self._write(runner.work_dir)

    def after_test(self, runner):
        self._write(runner.work_dir)

    @master_only  # (dist_train.sh: one file per run, from rank 0)
    def _write(self, work_dir):
        self._read()
        peaks = dict(cuda=torch.cuda.is_available())
        if peaks['cuda']:
            peaks.update(allocated_mb=self._peaks['allocated'] // 2**20,
                         reserved_mb=self._peaks['reserved'] // 2**20)
        with open(osp.join(work_dir, FILE_NAME), 'w') as f:
            json.dump(peaks, f)


def read_peaks(work_dir):
    """The peaks a run's hook wrote, or None (no file: the hook did not run)."""
    path = osp.join(work_dir, FILE_NAME)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
