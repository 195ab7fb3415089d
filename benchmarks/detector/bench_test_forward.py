"""Model time per test image, by test path: the captured test forward with e2cnn's modules and
float32 matrix products against the paths tools/test.py offers (plain convolutions, TF32 matrix
products, --amp), on the same checkpoint and images in one process, with what each path detects.
(Every path runs float32 convolutions as torch is set to: in TF32 by cuDNN's default.)

Each path is a model of its own, built from the config and the checkpoint: its test steps run as
RedetTestLoop runs them (each image's detections cut while the next image runs), back to back on
batches already loaded, with one synchronisation at the end. The paths take turns, round after
round, and each path's time is the median of its rounds: a drift of the clocks falls on all
alike. Data loading is left out (tools/test.py's loader runs beside the model: see
benchmarks/profiling/profile_test_loop.py for the loop around it). The images are the config's
annotated validation set: each path's mAP comes from the config's val_evaluator, and its
detections are matched one to one with the first path's (same label, score within 1e-3, every
box number within 1e-3 of the box's size).

    python -m benchmarks.detector.bench_test_forward --config CONFIG --checkpoint CKPT --out F
(from the repository root; --data-root: a folder with val/images and val/labelTxt instead of
the config's validation set)
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
from benchmarks.detector.mmrotate_parity import match_count
from benchmarks.profiling.profile_detector import one_behind

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# name: (plain convolutions, TF32 matrix products, fp16 autocast, how tools/test.py runs it);
# the first is the one the others are compared with
PATHS = {
    'equivariant_fp32': (False, False, False,
                         '--equivariant --cfg-options model.tf32_predict=False'),
    'plain_fp32': (True, False, False, '--cfg-options model.tf32_predict=False'),
    'plain_tf32': (True, True, False, 'none (the default)'),
    'plain_amp': (True, True, True, '--amp'),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--checkpoint', required=True)
    p.add_argument('--data-root', help='a folder with val/images and val/labelTxt (default: the '
                                       "config's validation set)")
    p.add_argument('--images', type=int, default=20, help='measured images per round')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--warmup', type=int, default=5, help='unmeasured images per path first')
    p.add_argument('--paths', nargs='+', choices=list(PATHS),
                   help='default: all, less plain_amp on the CPU; the first is the one the '
                        'others are compared with')
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
        cfg.val_dataloader.dataset.update(
            data_root=osp.abspath(args.data_root) + '/', ann_file='val/labelTxt/',
            data_prefix=dict(img_path='val/images/'))
    return cfg


def val_batches(cfg, count):
    """`count` batches of the validation set (read again when it is smaller) and its metainfo."""
    from mmengine.runner import Runner
    loader_cfg = cfg.val_dataloader.copy()
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
            sys.exit(f'bench_test_forward: the validation set of {cfg.filename} is empty')
    return batches, loader.dataset.metainfo


def build_path(cfg, args, name):
    """The model of one path, with the checkpoint loaded and in eval mode."""
    from mmdet.registry import MODELS
    from mmengine.runner import load_checkpoint

    from redet_plugin.inference.plain_model import make_plain
    plain, tf32, amp, _ = PATHS[name]
    model_cfg = cfg.model.copy()
    model_cfg['tf32_predict'] = tf32
    model = MODELS.build(model_cfg)
    load_checkpoint(model, args.checkpoint, map_location='cpu', logger='silent')
    model.to(args.device)
    if plain:
        make_plain(model, half=amp)  # (what tools/test.py's PlainTestHook does)
    return model.eval()


def step_args(args, name):
    """What a test step of path `name` reads (profile_detector's one_behind): the device and
    whether it runs under fp16 autocast."""
    return SimpleNamespace(device=args.device, amp=PATHS[name][2])


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


def detections(model, step_args, batches):
    """Each image's data sample with its detections, as the test loop hands them on; copies:
    a test step writes its detections into the batch's own samples, which every path shares."""
    samples = []
    step, flush = one_behind(model, step_args, lambda idx, batch, outputs: samples.extend(
        sample.clone() for sample in outputs))
    for batch in batches:
        step(batch)
    flush()
    return samples


def mean_ap(cfg, metainfo, samples):
    from mmengine.evaluator import Evaluator
    evaluator = Evaluator(cfg.val_evaluator)
    evaluator.dataset_meta = metainfo
    evaluator.process(data_samples=samples)
    metrics = evaluator.evaluate(len(samples))
    return next(value for key, value in metrics.items() if key.split('/')[-1] == 'mAP')


def as_tensors(sample):
    from mmdet.structures.bbox import get_box_tensor
    dets = sample.pred_instances
    return get_box_tensor(dets.bboxes).float(), dets.scores.float(), dets.labels


def matched_share(samples, reference):
    """The share of the reference's detections that have their counterpart in `samples`."""
    matched = sum(match_count(as_tensors(ours), as_tensors(theirs), 1e-3, 1e-3)
                  for ours, theirs in zip(samples, reference))
    total = sum(len(sample.pred_instances) for sample in reference)
    return round(matched / total, 4) if total else None


def main(argv=None):
    args = parse_args(argv)
    from mmengine.registry import init_default_scope
    cfg = load_config(args)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    batches, metainfo = val_batches(cfg, args.warmup + args.images)
    warmup, timed = batches[:args.warmup], batches[args.warmup:]
    models, steps = {}, {}
    for name in args.paths:
        models[name] = build_path(cfg, args, name)
        step, flush = one_behind(models[name], step_args(args, name))
        for batch in warmup:  # (the predict graphs are captured here)
            step(batch)
        flush()
        steps[name] = (step, flush)
    times = {name: [] for name in args.paths}
    for _ in range(args.rounds):
        for name in args.paths:
            times[name].append(ms_per_image(*steps[name], timed, args.device))
    runs, reference = {}, None
    for name in args.paths:
        plain, tf32, amp, how = PATHS[name]
        samples = detections(models[name], step_args(args, name), timed)
        if reference is None:
            reference = samples
        runs[name] = dict(
            plain=plain, tf32=tf32, amp=amp, tools_test_options=how,
            ms_per_image=round(statistics.median(times[name]), 3),
            rounds_ms=[round(t, 3) for t in times[name]],
            detections_per_image=round(statistics.fmean(
                len(sample.pred_instances) for sample in samples), 1),
            mAP=round(mean_ap(cfg, metainfo, samples), 4),
            matched_to_first=matched_share(samples, reference))
        del models[name]
    first = runs[args.paths[0]]
    for run in runs.values():
        run['speedup_vs_first'] = round(first['ms_per_image'] / run['ms_per_image'], 2)
        run['mAP_minus_first'] = round(run['mAP'] - first['mAP'], 4)
    result = dict(
        what=__doc__.splitlines()[0],
        command=' '.join(['python -m benchmarks.detector.bench_test_forward']
                         + (argv if argv is not None else sys.argv[1:])),
        config=osp.relpath(cfg.filename, REPO) if cfg.filename.startswith(REPO)
        else cfg.filename, checkpoint=args.checkpoint, first=args.paths[0],
        images=args.images, rounds=args.rounds, warmup=args.warmup,
        environment=environment(int(torch.device(args.device).type == 'cuda')), runs=runs)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    for name, run in runs.items():
        print(f"{name:18s} {run['ms_per_image']:8.3f} ms / image  x{run['speedup_vs_first']}  "
              f"mAP {run['mAP']:.4f}  {run['detections_per_image']} detections, "
              f"{run['matched_to_first']} matched to {args.paths[0]}'s")
    return result


if __name__ == '__main__':
    main()
