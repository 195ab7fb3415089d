"""Where the main process of tools/test.py spends each image: waiting for the data loader, in the
model's test_step (preprocessing and launching the forward), reading the previous image's
detections back (the wait for the GPU and the cut), in the evaluator and in the per-image hooks.

    python -m benchmarks.profiling.profile_test_loop [--config CONFIG] [--checkpoint CKPT]
        [--images 60] [--warmup 10] [--out test_loop.json] [--profiler {cprofile,torch}] [--cpu]
        [-- tools/test.py options]

tools/test.py runs in this process as users run it (its main(), the config's loader and hooks),
with each part wrapped by a timer; the parts nest as the loop calls them (the evaluator and the
hooks run inside the read-back), and each is reported without the parts inside it. The first
--warmup test steps (captures, workers starting) are not counted. `--profiler cprofile` adds the
functions with the most time of their own and of their callees' (each with its callers),
`--profiler torch` torch.profiler's ops and CUDA runtime calls by host time (a runtime call that
waits for the GPU shows there), both over the same images; a profiler slows the loop, and from
Python 3.12 on cProfile records every thread (the pin-memory thread's calls show up under the main
thread's): the time per image of record is a run without one. Without --checkpoint the config's
initial weights are tested (an untrained head keeps many boxes: the evaluator sees more than with
trained weights). Without a data root in the options, a synthetic DOTA-format set is generated
first (not timed). --cpu: the tiny config on 96² images, to check the script on a machine without a
GPU.
"""
import argparse
import cProfile
import functools
import io
import json
import os.path as osp
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from typing import Optional

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PARTS = ('loader wait', 'test_step (preprocess, launch)', 'read-back (GPU wait, cut)',
         'evaluator.process', 'per-image hooks')


class _Timers:
    """Time of each part, its nested parts' time taken out, counted from the test_step numbered
    `start` + 1 on."""

    def __init__(self, start: int, profiler: Optional[str]):
        self.start, self.steps, self.images, self.begun = start, 0, 0, None
        self.own = defaultdict(float)
        self.stack = []
        self.profiler = profiler
        self.profile = None

    def _start_profiler(self):
        import torch
        if self.profiler == 'cprofile':
            self.profile = cProfile.Profile()
            self.profile.enable()
        elif self.profiler == 'torch':
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profile = torch.profiler.profile(activities=activities)
            self.profile.__enter__()

    def _stop_profiler(self):
        if self.profiler == 'cprofile':
            self.profile.disable()
        elif self.profiler == 'torch':
            self.profile.__exit__(None, None, None)

    def counting(self) -> bool:
        return self.steps > self.start

    def wrap(self, part: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if part == PARTS[1]:
                self.steps += 1
                if self.steps == self.start + 1:
                    self._start_profiler()
                    self.begun = time.perf_counter()
                if self.counting():
                    self.images += len(args[0]['inputs'])
            self.stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - t0
                inner = self.stack.pop()
                if self.stack:
                    self.stack[-1] += total
                if self.counting():
                    self.own[part] += total - inner
        return timed

    def finish(self) -> float:
        if self.begun is None:
            raise SystemExit(f'only {self.steps} test steps: more than --warmup {self.start} '
                             'are needed')
        wall = time.perf_counter() - self.begun
        self._stop_profiler()
        return wall


def _short(file: str) -> str:
    """A source file named from the project's root or from its installed package's folder."""
    if 'site-packages/' in file:
        return file.split('site-packages/')[-1]
    return osp.relpath(file, ROOT) if file.startswith(ROOT) else file


def _name(function: tuple) -> str:
    file, line, name = function
    return f'{_short(file)}:{line}({name})'


def _profile_rows(profile: cProfile.Profile, images: int, key: str, top: int = 40) -> list:
    """The `top` functions by `key`, each with its three callers of the most cumulative time."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for function, (_, calls, own, cumulative, callers) in stats.stats.items():
        by_time = sorted(callers.items(), key=lambda item: -item[1][3])[:3]
        rows.append(dict(function=_name(function),
                         calls_per_image=round(calls / images, 2),
                         own_ms=round(own * 1e3 / images, 3),
                         cumulative_ms=round(cumulative * 1e3 / images, 3),
                         callers=[dict(function=_name(caller),
                                       cumulative_ms=round(timing[3] * 1e3 / images, 3))
                                  for caller, timing in by_time]))
    return sorted(rows, key=lambda row: -row[key])[:top]


def _torch_profiler_rows(profile, images: int, top: int = 30) -> list:
    """torch.profiler's `top` ops and runtime calls by host time of their own."""
    events = sorted(profile.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [dict(name=e.key, calls_per_image=round(e.count / images, 2),
                 own_host_ms=round(e.self_cpu_time_total / 1e3 / images, 3),
                 host_ms=round(e.cpu_time_total / 1e3 / images, 3),
                 device_ms=round(getattr(e, 'self_device_time_total', 0) / 1e3 / images, 3))
            for e in events]


def run_tool(argv: list, warmup: int, profiler: Optional[str] = None) -> dict:
    """tools/test.py main(argv) with its parts timed from test step warmup + 1 on."""
    import torch
    from redet_plugin.utils.transformers_hidden import transformers_hidden
    with transformers_hidden(argv):
        import redet_plugin.mm  # noqa: F401
    sys.path.insert(0, ROOT)
    from mmengine.evaluator import Evaluator
    from mmengine.runner import Runner
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from redet_plugin.structures.padded_results import PendingOutputs
    from tools.test import main

    timers = _Timers(warmup, profiler)
    patched = [(_BaseDataLoaderIter, '__next__', PARTS[0]), (PendingOutputs, 'read', PARTS[2]),
               (Evaluator, 'process', PARTS[3])]
    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in patched]
    run_test, call_hook = Runner.test, Runner.call_hook

    def timed_test(self):
        self.model.test_step = timers.wrap(PARTS[1], self.model.test_step)
        return run_test(self)

    timed_hook = timers.wrap(PARTS[4], call_hook)

    def hook(self, fn_name, **kwargs):
        fn = timed_hook if fn_name.endswith('_test_iter') else call_hook
        return fn(self, fn_name, **kwargs)

    try:
        for cls, name, part in patched:
            setattr(cls, name, timers.wrap(part, getattr(cls, name)))
        Runner.test, Runner.call_hook = timed_test, hook
        main(argv)
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
        Runner.test, Runner.call_hook = run_test, call_hook
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    # (the last image's read-back and the metric come after the last test_step: in the wall time)
    wall = timers.finish()
    images = timers.images
    parts = {part: round(timers.own[part] * 1e3 / images, 3) for part in PARTS}
    per_image = wall * 1e3 / images
    parts['other (the loop, the metric at the end)'] = round(per_image - sum(parts.values()), 3)
    result = dict(images=images, ms_per_image=round(per_image, 3), parts_ms=parts,
                  loader_wait_share=round(parts[PARTS[0]] / per_image, 3), profiler=profiler)
    if profiler == 'cprofile':
        result.update(profile_own=_profile_rows(timers.profile, images, 'own_ms'),
                      profile_cumulative=_profile_rows(timers.profile, images, 'cumulative_ms'))
    elif profiler == 'torch':
        result.update(torch_profile=_torch_profiler_rows(timers.profile, images))
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    tool_options = argv[argv.index('--') + 1:] if '--' in argv else []
    argv = argv[:argv.index('--')] if '--' in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', default=None)
    parser.add_argument('--checkpoint', default=None)
    parser.add_argument('--images', type=int, default=60)
    parser.add_argument('--warmup', type=int, default=10)
    parser.add_argument('--out', default=None)
    parser.add_argument('--profiler', choices=('cprofile', 'torch'), default=None)
    parser.add_argument('--cpu', action='store_true')
    args = parser.parse_args(argv)
    from benchmarks.profiling.startup_phases import R50, TINY, _data_options
    config = args.config or (TINY if args.cpu else R50)
    work = tempfile.mkdtemp(prefix='test_loop_')
    options = []
    if not any('data_root' in option for option in tool_options):
        from redet_plugin.datasets.synthetic import ensure_synthetic_dota
        data_root = osp.join(work, 'data') + '/'
        ensure_synthetic_dota(data_root, num_train=0, num_val=args.images,
                              image_size=96 if args.cpu else 1024, seed=0, progress=False)
        options += _data_options(data_root)
    if args.cpu:
        # (the tiny config's data set generates itself unless it finds these parameters' set)
        synthetic = 'test_dataloader.dataset.synthetic'
        options += ['test_dataloader.batch_size=1', 'test_dataloader.num_workers=0',
                    'test_dataloader.persistent_workers=False', f'{synthetic}.image_size=96',
                    f'{synthetic}.num_train=0', f'{synthetic}.num_val={args.images}']
    checkpoint = args.checkpoint
    if checkpoint is None:
        from benchmarks._initial_checkpoint import save_initial_checkpoint
        checkpoint = osp.join(work, 'initial.pth')
        save_initial_checkpoint(config, checkpoint)
    tool_argv = [config, checkpoint, '--work-dir', osp.join(work, 'test'), *tool_options]
    if options:  # (mmengine's DictAction merges a second --cfg-options into the first)
        tool_argv += ['--cfg-options', *options]
    result = run_tool(tool_argv, args.warmup, args.profiler)
    import torch

    from benchmarks.detector.bench_detector_vs_mmrotate import environment
    result = dict(what=__doc__.splitlines()[0], config=osp.relpath(config, ROOT),
                  checkpoint=args.checkpoint or 'initial weights', tool_argv=tool_argv[3:],
                  warmup=args.warmup, environment=environment(torch.cuda.device_count()),
                  **result)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    print(f"{result['ms_per_image']:.2f} ms / image over {result['images']} images")
    for part, ms in result['parts_ms'].items():
        print(f'  {ms:8.3f} ms  {part}')
    for row in result.get('profile_own', [])[:15]:
        print(f"  {row['own_ms']:8.3f} ms own  {row['calls_per_image']:7.1f} calls  "
              f"{row['function']}")
    for row in result.get('torch_profile', []):
        print(f"  {row['own_host_ms']:8.3f} ms own on the host  {row['device_ms']:8.3f} ms on the "
              f"device  {row['calls_per_image']:7.1f} calls  {row['name']}")
    return result


if __name__ == '__main__':
    main()
