"""Model time per test image, by test path: the captured test forward with e2cnn's modules in
full float32 against the paths tools/test.py offers (plain convolutions, TF32 matrix products,
--amp), on the same checkpoint and images in one process.

Each path is a model of its own, built from the config and the checkpoint: its test steps run as
RedetTestLoop runs them (each image's detections cut while the next image runs), back to back on
batches already loaded, with one synchronisation at the end. The paths take turns, round after
round, and each path's time is the median of its rounds: a drift of the clocks falls on all
alike. Data loading is left out (tools/test.py's loader runs beside the model: see
benchmarks/profiling/profile_test_loop.py for the loop around it).

    python -m benchmarks.detector.bench_test_forward --config CONFIG --checkpoint CKPT --out F
(from the repository root; the config's test set, or --data-root with val/images and val/labelTxt)
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from benchmarks.detector.bench_detector_vs_mmrotate import environment
from benchmarks.profiling.profile_detector import one_behind, plain_test_image

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BASELINE = 'equivariant_fp32'
# name: (plain convolutions, TF32 matrix products, fp16 autocast, how tools/test.py runs it)
PATHS = {
    BASELINE: (False, False, False, '--equivariant --cfg-options model.tf32_predict=False'),
    'plain_fp32': (True, False, False, '--cfg-options model.tf32_predict=False'),
    'plain_tf32': (True, True, False, '(the default)'),
    'plain_amp': (True, True, True, '--amp'),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--checkpoint', required=True)
    p.add_argument('--data-root', help='a folder with val/images and val/labelTxt (default: the '
                                       "config's test set)")
    p.add_argument('--images', type=int, default=20, help='measured images per round')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--warmup', type=int, default=5, help='unmeasured images per path first')
    p.add_argument('--paths', nargs='+', choices=list(PATHS),
                   help='default: all, less plain_amp on the CPU')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--out', required=True, help='JSON file')
    args = p.parse_args(argv)
    if args.images < 1 or args.rounds < 1 or args.warmup < 0:
        p.error('--images and --rounds must be at least 1, --warmup at least 0')
    cpu = torch.device(args.device).type == 'cpu'
    if args.paths is None:
        args.paths = [name for name, (_, _, amp, _) in PATHS.items() if not (cpu and amp)]
    elif cpu and any(PATHS[name][2] for name in args.paths):
        p.error('--paths plain_amp needs a GPU (fp16 autocast); leave it out on the CPU')
    return args


def load_config(args):
    from mmengine.config import Config
    cfg = Config.fromfile(args.config)
    if args.data_root:
        cfg.test_dataloader.dataset.update(
            data_root=osp.abspath(args.data_root) + '/', ann_file='val/labelTxt/',
            data_prefix=dict(img_path='val/images/'))
    return cfg


def test_batches(cfg, count):
    from mmengine.runner import Runner
    loader_cfg = cfg.test_dataloader.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    loader = Runner.build_dataloader(loader_cfg)
    batches = []
    while len(batches) < count:  # (a small test set is read again)
        before = len(batches)
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
        if len(batches) == before:
            sys.exit(f'bench_test_forward: the test set of {cfg.filename} is empty')
    return batches


def build_path(cfg, args, name):
    """The model of one path, with the checkpoint loaded and in eval mode."""
    from mmdet.registry import MODELS
    from mmengine.runner import load_checkpoint

    from redet_plugin.inference.plain_model import make_plain
    plain, tf32, _, _ = PATHS[name]
    model_cfg = cfg.model.copy()
    model_cfg['tf32_predict'] = tf32
    model = MODELS.build(model_cfg)
    load_checkpoint(model, args.checkpoint, map_location='cpu', logger='silent')
    model.to(args.device)
    if plain:
        make_plain(model)  # (what tools/test.py's PlainTestHook does)
    return model.eval()


def sync(device):
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def ms_per_image(step, finish, batches, device):
    """Back to back as a Runner runs its steps: the larger of the host's and the GPU's time."""
    sync(device)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    finish()
    sync(device)
    return 1000 * (time.perf_counter() - start) / len(batches)


def detections_per_image(model, batches, step_args):
    counts = []
    for batch in batches:
        for sample in plain_test_image(model, batch, step_args):
            counts.append(len(sample.pred_instances))
    return statistics.fmean(counts)


def main(argv=None):
    args = parse_args(argv)
    from mmengine.registry import init_default_scope
    cfg = load_config(args)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    batches = test_batches(cfg, args.warmup + args.images)
    warmup, timed = batches[:args.warmup], batches[args.warmup:]
    models, steps = {}, {}
    for name in args.paths:
        step_args = SimpleNamespace(amp=PATHS[name][2], device=args.device)
        models[name] = build_path(cfg, args, name)
        for batch in warmup:  # (the predict graphs are captured here)
            plain_test_image(models[name], batch, step_args)
        steps[name] = (step_args, *one_behind(models[name], step_args))
    times = {name: [] for name in args.paths}
    for _ in range(args.rounds):
        for name in args.paths:
            _, step, finish = steps[name]
            times[name].append(ms_per_image(step, finish, timed, args.device))
    runs = {}
    for name in args.paths:
        plain, tf32, amp, how = PATHS[name]
        runs[name] = dict(
            plain=plain, tf32=tf32, amp=amp, tools_test_options=how,
            ms_per_image=round(statistics.median(times[name]), 3),
            rounds_ms=[round(t, 3) for t in times[name]],
            detections_per_image=round(detections_per_image(models[name], timed,
                                                            steps[name][0]), 1))
    if BASELINE in runs:
        for run in runs.values():
            run['speedup_vs_baseline'] = round(
                runs[BASELINE]['ms_per_image'] / run['ms_per_image'], 2)
    result = dict(
        what=__doc__.splitlines()[0],
        command=' '.join(['python -m benchmarks.detector.bench_test_forward']
                         + (argv if argv is not None else sys.argv[1:])),
        config=osp.relpath(cfg.filename, REPO) if cfg.filename.startswith(REPO)
        else cfg.filename, checkpoint=args.checkpoint, baseline=BASELINE,
        images=args.images, rounds=args.rounds, warmup=args.warmup,
        environment=environment(int(torch.device(args.device).type == 'cuda')), runs=runs)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    for name, run in runs.items():
        print(f"{name:18s} {run['ms_per_image']:8.3f} ms / image  "
              f"x{run.get('speedup_vs_baseline', '-')}  {run['detections_per_image']} detections")
    return result


if __name__ == '__main__':
    main()
