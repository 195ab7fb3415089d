"""PeakMemoryHook: writes the CUDA peak of allocated *and reserved* memory of a training or test
run to <work_dir>/peak_memory.json (benchmarks/bench_detector_vs_mmrotate.py adds it to every
run). mmengine logs only the allocated peak, and a CUDA graph's activations live in its private
pool, which stays reserved (not allocated) between replays: the reserved peak is the footprint
that compares runs with and without graphs."""
import json
import os.path as osp

import torch
from mmengine.dist import master_only
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

FILE_NAME = 'peak_memory.json'


@HOOKS.register_module()
class PeakMemoryHook(Hook):
    priority = 'VERY_LOW'

    def after_train(self, runner):
        self._write(runner.work_dir)

    def after_test(self, runner):
        self._write(runner.work_dir)

    @staticmethod
    @master_only  # (dist_train.sh: one file per run, from rank 0)
    def _write(work_dir):
        peaks = dict(cuda=torch.cuda.is_available())
        if peaks['cuda']:  # (the process's default device: these runs use one GPU per process)
            peaks.update(allocated_mb=torch.cuda.max_memory_allocated() // 2**20,
                         reserved_mb=torch.cuda.max_memory_reserved() // 2**20)
        with open(osp.join(work_dir, FILE_NAME), 'w') as f:
            json.dump(peaks, f)


def read_peaks(work_dir):
    """The peaks a run's hook wrote, or None (no file: the hook did not run)."""
    path = osp.join(work_dir, FILE_NAME)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
