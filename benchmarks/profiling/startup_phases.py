"""Where a tool's start-up goes: tools/train.py and tools/test.py, each in a fresh process, from
the process's start to the end of its first iterations, split into phases (imports, config,
building the Runner and the model, the data loader's first batch, the first step with its
warm-up and captures, the next steps).

    python -m benchmarks.profiling.startup_phases [--config CONFIG] [--data-root DIR]
        [--steps 5] [--out startup_h200.json] [--cpu]

Each tool runs as users run it (`python tools/train.py CONFIG ...`), in a child process that
marks the phases as it reaches them; a step's end is marked after torch.cuda.synchronize(). The
child stops after `--steps` training steps or test images. Without --data-root, a synthetic
DOTA-format set of 1024² images is generated first (not timed). The result says whether the
environment's bytecode was compiled (pip compiles it at install; on a machine without it every
start compiles the packages from source: benchmarks/device_run.sh's COMPILE_BYTECODE=1 does it
first). --cpu: the tiny config on 96² images, to check the script on a machine without a GPU.
"""
import argparse
import json
import os.path as osp
import subprocess
import sys
import tempfile
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
R50 = osp.join(ROOT, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py')
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


class _Stop(Exception):
    pass


def _child(tool: str, marks_file: str, steps: int, launched: float, argv: list) -> None:
    """Runs tools/<tool>.py main(argv), writing (phase, seconds since the parent launched this
    process at `launched`, a time.time())."""
    marks = []

    def mark(name):
        marks.append((name, time.time() - launched))

    mark('python started (the interpreter, this module)')

    import torch
    mark('import torch')
    from redet_plugin.utils.transformers_hidden import transformers_hidden
    with transformers_hidden(argv):  # as the tool imports the stack
        import redet_plugin.mm  # noqa: F401
    mark('import redet_plugin.mm (mmengine, mmdet, mmcv, e2cnn)')
    sys.path.insert(0, ROOT)
    main = __import__(f'tools.{tool}', fromlist=['main']).main
    from mmengine.runner import Runner

    from redet_plugin.engine import PlainTestHook
    mark(f'import tools/{tool}.py')
    from_cfg, run = Runner.from_cfg.__func__, getattr(Runner, 'train' if tool == 'train' else 'test')
    step_name = 'train_step' if tool == 'train' else 'test_step'

    def timed_from_cfg(cls, cfg):
        mark('config read and checked')
        runner = from_cfg(cls, cfg)
        mark('Runner built (model, hooks)')
        return runner

    load, plain = Runner.load_or_resume, PlainTestHook.before_test

    def timed_load(self):
        load(self)
        mark('loops and optimizer built, weights initialised or loaded')

    def timed_plain(self, runner):
        plain(self, runner)
        mark('backbone and neck made plain convolutions')

    def timed_run(self):
        mark(f'Runner.{run.__name__} called (the tool\'s checks: the data set read)')
        model_step, calls = getattr(self.model, step_name), [0]

        def step(data, *args, **kwargs):
            if calls[0] == 0:
                mark('first batch loaded (data loader started, model on the device)')
            result = model_step(data, *args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            calls[0] += 1
            if calls[0] == 1:
                mark(f'first {step_name} done (warm-up, captures)')
            if calls[0] == steps:
                mark(f'{steps} {step_name}s done')
                raise _Stop
            return result
        setattr(self.model, step_name, step)
        return run(self)

    Runner.from_cfg = classmethod(timed_from_cfg)
    setattr(Runner, run.__name__, timed_run)
    Runner.load_or_resume, PlainTestHook.before_test = timed_load, timed_plain
    try:
        main(argv)
    except _Stop:
        pass
    with open(marks_file, 'w') as f:
        json.dump(marks, f)


def _data_options(data_root: str) -> list:
    return [f'{loader}.dataset.data_root={data_root}' for loader in LOADERS]


def measure(tool: str, argv: list, steps: int) -> dict:
    """The phases of one run of tools/<tool>.py in a fresh process, in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = osp.join(tmp, 'marks.json')
        launched = time.time()
        child = subprocess.run(
            [sys.executable, '-m', 'benchmarks.profiling.startup_phases', '--child', tool,
             marks_file, str(steps), repr(launched), '--', *argv], cwd=ROOT,
            capture_output=True, text=True)
        if child.returncode != 0 or not osp.exists(marks_file):
            raise SystemExit(f'tools/{tool}.py {argv}: exit {child.returncode}\n'
                             f'{child.stdout[-3000:]}\n{child.stderr[-3000:]}')
        with open(marks_file) as f:
            marks = json.load(f)
    rows, previous = [], 0.0
    for name, at in marks:
        rows.append(dict(phase=name, seconds=round(at - previous, 3),
                         since_start=round(at, 3)))
        previous = at
    return dict(tool=tool, argv=argv, phases=rows, total_s=round(marks[-1][1], 3))


def bytecode_compiled() -> bool:
    """Whether torch's modules have their compiled bytecode, as pip leaves an install: without
    it (and with PYTHONDONTWRITEBYTECODE set, as on the GPU machine) every start compiles torch,
    sympy and the rest from source, seconds that a user's start does not spend."""
    import importlib.util

    import torch
    return osp.exists(importlib.util.cache_from_source(torch.__file__))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', default=None)
    parser.add_argument('--data-root', default=None)
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--out', default=None)
    parser.add_argument('--cpu', action='store_true')
    args = parser.parse_args(argv)
    config = args.config or (TINY if args.cpu else R50)
    work = tempfile.mkdtemp(prefix='startup_')
    data_root = args.data_root
    if data_root is None:
        from redet_plugin.datasets.synthetic import ensure_synthetic_dota
        data_root = osp.join(work, 'data') + '/'
        size = 96 if args.cpu else 1024
        ensure_synthetic_dota(data_root, num_train=2 * args.steps, num_val=args.steps,
                              image_size=size, seed=0, progress=False)
    options = _data_options(data_root)
    if args.cpu:
        options += [f'{loader}.num_workers=0' for loader in LOADERS] + \
                   [f'{loader}.persistent_workers=False' for loader in LOADERS] + \
                   [f'{loader}.dataset.synthetic.image_size=96' for loader in LOADERS]
    train = measure('train', [config, '--work-dir', osp.join(work, 'train'), '--cfg-options',
                              *options], args.steps)
    from benchmarks._initial_checkpoint import save_initial_checkpoint
    checkpoint = osp.join(work, 'ckpt.pth')
    save_initial_checkpoint(config, checkpoint)
    test = measure('test', [config, checkpoint, '--work-dir', osp.join(work, 'test'),
                            '--cfg-options', *options], args.steps)
    import torch

    from benchmarks.detector.bench_detector_vs_mmrotate import environment
    result = dict(config=osp.relpath(config, ROOT), steps=args.steps,
                  environment=environment(torch.cuda.device_count()),
                  bytecode_compiled=bytecode_compiled(), runs=[train, test])
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
    for run in result['runs']:
        print(f"tools/{run['tool']}.py: {run['total_s']:.1f} s to {args.steps} steps")
        for row in run['phases']:
            print(f"  {row['seconds']:7.2f} s  {row['phase']}")
    return result


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--child':
        tool, marks_file, steps, launched = sys.argv[2], sys.argv[3], int(sys.argv[4]), \
            float(sys.argv[5])
        _child(tool, marks_file, steps, launched, sys.argv[7:])
    else:
        main()
