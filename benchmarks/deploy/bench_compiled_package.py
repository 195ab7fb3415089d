"""Time per image of an exported ReDet (tools/export.py) against the model as tools/test.py and
tools/infer.py run it, same checkpoint, same images, same process.

Runs, each on --images images of --image-size² (one image a forward, the detections read back
to the host, as a user of each gets them), after --warmup unmeasured images:
  test_step  RotatedDetector.predict_patches (the config's model with its defaults: backbone and
             neck as plain convolutions, the captured test forward on a GPU), i.e. the model
             time of tools/test.py and tools/infer.py
  program    the exported program (redet_plugin.deploy.load of a `tools/export.py` package)
  compiled   the AOTInductor package (`tools/export.py --compile`); its compile time is recorded
             (both loaded with load's defaults: on a GPU, replayed as a CUDA graph, matrix
             products in TF32; recorded)
  compiled_fp16  the same with `--dtype float16` (the forward under fp16 autocast, as
             `tools/test.py --amp` runs it; GPU only)
  mmrotate_test  mmrotate's tools/test.py, as its users run it, with its ReDet DOTA config on the
             same images (its initial weights, or --mmrotate-checkpoint): from its log, one line
             an image, its model's time per image (mmengine's time less data_time: the image
             decoded and loaded, as the other runs get it) and the time end to end
Each image's wall-clock time (the host waits for the detections, so no extra synchronisation is
needed); medians. The detections' counts are recorded beside, and the speed-up of the compiled
package over test_step is set against the goal (1.5×); the speed-ups over mmrotate's test.py
beside.

    python -m benchmarks.deploy.bench_compiled_package --out compiled_package.json
        [--checkpoint CKPT] [--mmrotate-checkpoint CKPT] [--device cuda]
        [--runs test_step program compiled compiled_fp16 mmrotate_test]
(from the repository root; images: the --data-root's val/images/, generated when missing.)
Without --checkpoint the config's initialisation is used: an untrained head fills the NMS, so
times are then an upper bound of a trained model's.
"""
import argparse
import glob
import os
import os.path as osp
import pickle
import shutil
import statistics
import sys
import tempfile
import time

import torch

from benchmarks._initial_checkpoint import save_initial_checkpoint
from benchmarks._timing import write_json

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RUNS = ('test_step', 'program', 'compiled', 'compiled_fp16', 'mmrotate_test')
PACKAGES = {'program': dict(compile=False), 'compiled': dict(compile=True),  # export's arguments
            'compiled_fp16': dict(compile=True, dtype='float16')}
GOAL_COMPILED_OVER_TEST_STEP = 1.5
MMROTATE_CONFIG = 'mmrotate::redet/redet-le90_re50_refpn_1x_dota.py'


def add_model_and_image_arguments(p):
    """--config, --checkpoint, --data-root, --image-size, --images and --warmup (shared with
    benchmarks/profiling/profile_compiled_package.py)."""
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--checkpoint', help="trained weights (default: the config's initialisation)")
    p.add_argument('--data-root', default=osp.join(REPO, 'data', 'synthetic_dota_1024'),
                   help='DOTA-format folder whose val/images/ are timed (generated when missing)')
    p.add_argument('--image-size', type=int, default=1024)
    p.add_argument('--images', type=int, default=20, help='timed images per run')
    p.add_argument('--warmup', type=int, default=3, help='unmeasured images before each run')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file for the results')
    add_model_and_image_arguments(p)
    p.add_argument('--mmrotate-checkpoint',
                   help="mmrotate_test's weights (default: its config's initialisation)")
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                   choices=('cuda', 'cpu'))
    p.add_argument('--runs', nargs='+', default=list(RUNS), choices=RUNS)
    p.add_argument('--work-dir',
                   help='where the packages are written (default: a temporary folder)')
    args = p.parse_args(argv)
    for name in ('images', 'image_size'):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f'--warmup: expected at least 0, got {args.warmup}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: torch sees no CUDA device here (use --device cpu)')
    for name in ('checkpoint', 'mmrotate_checkpoint'):
        path = getattr(args, name)
        if path and not osp.isfile(path):
            p.error(f"--{name.replace('_', '-')}: {path!r} is not a file")
    return args


def timed_paths(data_root, image_size, count):
    """The paths of `count` images of data_root/val/images/ (generated when missing), repeated
    when there are fewer."""
    folder = osp.join(data_root, 'val', 'images')
    if not glob.glob(osp.join(folder, '*.png')):
        from redet_plugin.datasets import generate_synthetic_dota
        generate_synthetic_dota(data_root, num_train=1, num_val=min(count, 20),
                                image_size=image_size, progress=False)
    paths = sorted(glob.glob(osp.join(folder, '*.png')))
    return [paths[i % len(paths)] for i in range(count)]


def load_images(paths, image_size):
    """The images at `paths`, BGR uint8, cut to image_size²."""
    import cv2
    return [cv2.imread(path)[:image_size, :image_size].copy() for path in paths]


def time_per_image(run_one, images, warmup):
    """(median ms per image, detections per image) of run_one(image) -> number of detections."""
    for image in images[:warmup]:
        run_one(image)
    times, counts = [], []
    for image in images[warmup:]:
        start = time.perf_counter()
        counts.append(run_one(image))
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times), counts


def test_step_runner(args):
    from redet_plugin.inference import RotatedDetector
    detector = RotatedDetector(args.config, args.checkpoint, device=args.device,
                               patch_size=args.image_size, patch_overlap=0)
    return lambda image: len(detector.predict_patches([image])[0].scores), detector


def package_runner(args, work_dir, name, export_arguments=None):
    """(run_one, seconds to make the package, the loaded detector) of the package `name`, made
    by export_detector with export_arguments (default: PACKAGES[name])."""
    from redet_plugin.deploy import load
    from redet_plugin.inference.export import export_detector
    path = osp.join(work_dir, f'{name}.pt2')
    start = time.perf_counter()
    export_detector(args.config, args.checkpoint, path, image_size=(args.image_size,) * 2,
                    device=args.device, **(export_arguments or PACKAGES[name]))
    made_s = time.perf_counter() - start
    detector = load(path)  # (as its users get it: on a GPU, replayed as a CUDA graph)
    return (lambda image: len(detector(image))), made_s, detector


def mmrotate_config_text(data_root, annfiles):
    """mmrotate's ReDet DOTA config with its test settings, reading the images whose labels are in
    `annfiles` and logging every image on its own line (its backbone's ImageNet file is not
    needed: the weights come from the checkpoint)."""
    root = osp.abspath(data_root) + '/'
    return f"""# Written by benchmarks/deploy/bench_compiled_package.py: the timed images.
_base_ = {MMROTATE_CONFIG!r}
model = dict(backbone=dict(init_cfg=None))
test_dataloader = dict(dataset=dict(data_root={root!r}, ann_file={annfiles!r},
                                    data_prefix=dict(img_path='val/images/')))
default_hooks = dict(logger=dict(interval=1))
log_processor = dict(window_size=1)
"""


def mmrotate_test_run(args, paths, work_dir):
    """mmrotate's tools/test.py on the images at `paths`: (its model's ms per image, ms per image
    end to end, detections per image or None), medians after --warmup images."""
    from benchmarks.detector.bench_detector_vs_mmrotate import (
        mmrotate_tools, run_logged, subprocess_env, tail, test_summary, write_peer_labels)
    if args.device != 'cuda':
        raise RuntimeError("--device cuda only: mmcv's RiRoIAlignRotated, which mmrotate's ReDet "
                           'runs, has no CPU kernel')
    tools = mmrotate_tools()
    if tools is None:
        raise RuntimeError('mmrotate is not installed (mmrotate-dev 1.0.1 is the peer)')
    run_dir = osp.join(work_dir, 'mmrotate_test')
    shutil.rmtree(run_dir, ignore_errors=True)  # (an earlier run's logs would mix into this one's)
    annfiles = osp.join(run_dir, 'annfiles')
    write_peer_labels(osp.join(args.data_root, 'val'), annfiles,
                      {osp.splitext(osp.basename(path))[0] for path in paths})
    config = osp.join(run_dir, 'mmrotate_config.py')
    with open(config, 'w') as f:
        f.write(mmrotate_config_text(args.data_root, annfiles + '/'))
    checkpoint = args.mmrotate_checkpoint
    if not checkpoint:
        checkpoint = osp.join(run_dir, 'initial.pth')
        save_initial_checkpoint(config, checkpoint)
    results, log = osp.join(run_dir, 'results.pkl'), osp.join(run_dir, 'test.log')
    # (its checkpoints hold mmengine objects that torch's weights-only loader refuses)
    rc, _ = run_logged([sys.executable, osp.join(tools, 'test.py'), config, checkpoint,
                        '--work-dir', osp.join(run_dir, 'logs'), '--out', results], log, None,
                       subprocess_env(dict(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='1')))
    if rc != 0:
        raise RuntimeError(f'its tools/test.py rc={rc}: {tail(log, 3).strip()}')
    summary = test_summary(osp.join(run_dir, 'logs'), skip=args.warmup)
    if summary['model_s_per_image'] is None:
        raise RuntimeError(f'its log has no time per image; see {log}')
    return (1000 * summary['model_s_per_image'], 1000 * summary['s_per_image'],
            detection_counts(results))


def detection_counts(results_pkl):
    """Detections per image in a test.py --out file (None when it cannot be read here)."""
    try:
        with open(results_pkl, 'rb') as f:
            return [len(result['pred_instances']['scores']) for result in pickle.load(f)]
    except Exception:  # (its boxes' class may not import in this process)
        return None


def timed_run(name, args, paths, images, work_dir):
    """(ms per image, detections per image, what else the run records) of one run."""
    if name == 'mmrotate_test':
        ms, end_to_end_ms, counts = mmrotate_test_run(args, paths, work_dir)
        return ms, counts, dict(end_to_end_ms_per_image=round(end_to_end_ms, 2))
    if name == 'test_step':
        run_one, detector = test_step_runner(args)
        tf32 = getattr(detector.model, 'predict_matmuls_in_tf32', lambda device: False)
        extra = dict(tf32=bool(tf32(detector.device)))
    else:
        run_one, made_s, detector = package_runner(args, work_dir, name)
        extra = dict(export_s=round(made_s, 1))
    ms, counts = time_per_image(run_one, images, args.warmup)
    if name != 'test_step':
        extra.update(cuda_graph=detector.cuda_graph, tf32=detector.tf32)
    return ms, counts, extra


def main(argv=None):
    args = parse_args(argv)
    import redet_plugin.mm  # noqa: F401  (the config's components)
    paths = timed_paths(args.data_root, args.image_size, args.images + args.warmup)
    images = load_images(paths, args.image_size)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='redet_packages_')
    os.makedirs(work_dir, exist_ok=True)
    if not args.checkpoint:  # one initialisation for every run, so that they detect alike
        args.checkpoint = osp.join(work_dir, 'initial.pth')
        save_initial_checkpoint(args.config, args.checkpoint)
        trained = False
    else:
        trained = True
    runs = {}
    for name in args.runs:
        try:
            ms, counts, extra = timed_run(name, args, paths, images, work_dir)
        except Exception as error:  # (one run failing must not lose the others' results)
            runs[name] = dict(error=f'{type(error).__name__}: {str(error).splitlines()[0]}')
            print(f'{name}: failed: {runs[name]["error"]}', file=sys.stderr)
        else:
            runs[name] = dict(ms_per_image=round(ms, 2), detections=counts, **extra)
            made = f" (made in {extra['export_s']:.0f} s)" if 'export_s' in extra else ''
            print(f'{name}: {ms:.2f} ms / image{made}')
        # written after every run: a time limit that cuts the (slow) compile keeps the others
        write_json(args.out, results_of(args, runs, trained, argv))
        if args.device == 'cuda':
            torch.cuda.empty_cache()  # (the next run's memory from a clean cache)


def results_of(args, runs, trained, argv):
    """The JSON of the runs so far, with the speed-ups over test_step and mmrotate's test.py, and
    the goal."""
    ratios = {}
    for base, faster in (('test_step', 'program'), ('test_step', 'compiled'),
                         ('test_step', 'compiled_fp16'), ('mmrotate_test', 'test_step'),
                         ('mmrotate_test', 'compiled'), ('mmrotate_test', 'compiled_fp16')):
        if 'ms_per_image' in runs.get(base, {}) and 'ms_per_image' in runs.get(faster, {}):
            ratios[f'{faster}_speedup_over_{base}'] = round(
                runs[base]['ms_per_image'] / runs[faster]['ms_per_image'], 3)
    speedup = ratios.get('compiled_speedup_over_test_step')
    environment = dict(device=torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu',
                       torch=torch.__version__, cuda=torch.version.cuda)
    return dict(
        environment=environment, command='python -m benchmarks.deploy.bench_compiled_package '
        + ' '.join(sys.argv[1:] if argv is None else argv),
        settings=dict(config=osp.relpath(args.config, REPO), trained_checkpoint=trained,
                      mmrotate_config=MMROTATE_CONFIG,
                      mmrotate_trained_checkpoint=bool(args.mmrotate_checkpoint),
                      image_size=args.image_size, images=args.images, warmup=args.warmup,
                      device=args.device),
        runs=runs, ratios=ratios,
        goals=dict(compiled_at_least_1_5x_test_step=(
            None if speedup is None else speedup >= GOAL_COMPILED_OVER_TEST_STEP)))


if __name__ == '__main__':
    main()
