"""Time per image of an exported ReDet (tools/export.py) against the model as tools/test.py and
tools/infer.py run it, same checkpoint, same images, same process.

Runs, each on --images images of --image-size² (one image a forward, the detections read back
to the host, as a user of each gets them), after --warmup unmeasured images:
  test_step  RotatedDetector.predict_patches (the config's model with its defaults: backbone and
             neck as plain convolutions, the captured test forward on a GPU), i.e. the model
             time of tools/test.py and tools/infer.py
  program    the exported program (redet_plugin.deploy.load of a `tools/export.py` package)
  compiled   the AOTInductor package (`tools/export.py --compile`); its compile time is recorded
Each image's wall-clock time (the host waits for the detections, so no extra synchronisation is
needed); medians. The detections' counts are recorded beside, and the speed-up of the compiled
package over test_step is set against the goal (1.5×).

    python -m benchmarks.deploy.bench_compiled_package --out compiled_package.json
        [--checkpoint CKPT] [--device cuda] [--runs test_step program compiled]
(from the repository root; images: the --data-root's val/images/, generated when missing.)
Without --checkpoint the config's initialisation is used: an untrained head fills the NMS, so
times are then an upper bound of a trained model's.
"""
import argparse
import glob
import os
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch

from benchmarks._timing import write_json

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RUNS = ('test_step', 'program', 'compiled')
GOAL_COMPILED_OVER_TEST_STEP = 1.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file for the results')
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--checkpoint', help="trained weights (default: the config's initialisation)")
    p.add_argument('--data-root', default=osp.join(REPO, 'data', 'synthetic_dota_1024'),
                   help='DOTA-format folder whose val/images/ are timed (generated when missing)')
    p.add_argument('--image-size', type=int, default=1024)
    p.add_argument('--images', type=int, default=20, help='timed images per run')
    p.add_argument('--warmup', type=int, default=3, help='unmeasured images before each run')
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
    if args.checkpoint and not osp.isfile(args.checkpoint):
        p.error(f'--checkpoint: {args.checkpoint!r} is not a file')
    return args


def load_images(data_root, image_size, count):
    """`count` BGR uint8 images of image_size² from data_root/val/images/ (generated when
    missing), repeated when there are fewer."""
    import cv2
    folder = osp.join(data_root, 'val', 'images')
    if not glob.glob(osp.join(folder, '*.png')):
        from redet_plugin.datasets import generate_synthetic_dota
        generate_synthetic_dota(data_root, num_train=1, num_val=min(count, 20),
                                image_size=image_size, progress=False)
    paths = sorted(glob.glob(osp.join(folder, '*.png')))
    images = []
    for i in range(count):
        image = cv2.imread(paths[i % len(paths)])
        images.append(image[:image_size, :image_size].copy())
    return images


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
    return lambda image: len(detector.predict_patches([image])[0].scores)


def package_runner(args, work_dir, compile):
    from redet_plugin.deploy import load
    from redet_plugin.inference.export import export_detector
    path = osp.join(work_dir, 'compiled.pt2' if compile else 'program.pt2')
    start = time.perf_counter()
    export_detector(args.config, args.checkpoint, path, image_size=(args.image_size,) * 2,
                    device=args.device, compile=compile)
    made_s = time.perf_counter() - start
    detector = load(path)
    return (lambda image: len(detector(image))), made_s


def main(argv=None):
    args = parse_args(argv)
    import redet_plugin.mm  # noqa: F401  (the config's components)
    images = load_images(args.data_root, args.image_size, args.images + args.warmup)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='redet_packages_')
    os.makedirs(work_dir, exist_ok=True)
    if not args.checkpoint:  # one initialisation for every run, so that they detect alike
        from benchmarks._initial_checkpoint import save_initial_checkpoint
        args.checkpoint = osp.join(work_dir, 'initial.pth')
        save_initial_checkpoint(args.config, args.checkpoint)
        trained = False
    else:
        trained = True
    runs = {}
    for name in args.runs:
        made_s = None
        try:
            if name == 'test_step':
                run_one = test_step_runner(args)
            else:
                run_one, made_s = package_runner(args, work_dir, compile=name == 'compiled')
            ms, counts = time_per_image(run_one, images, args.warmup)
        except Exception as error:  # (one run failing must not lose the others' results)
            runs[name] = dict(error=f'{type(error).__name__}: {str(error).splitlines()[0]}')
            print(f'{name}: failed: {runs[name]["error"]}', file=sys.stderr)
        else:
            runs[name] = dict(ms_per_image=round(ms, 2), detections=counts,
                              **({} if made_s is None else dict(export_s=round(made_s, 1))))
            made = '' if made_s is None else f' (made in {made_s:.0f} s)'
            print(f'{name}: {ms:.2f} ms / image{made}')
        # written after every run: a time limit that cuts the (slow) compile keeps the others
        write_json(args.out, results_of(args, runs, trained, argv))
        if args.device == 'cuda':
            torch.cuda.empty_cache()  # (the next run's memory from a clean cache)


def results_of(args, runs, trained, argv):
    """The JSON of the runs so far, with the speed-ups over test_step and the goal."""
    ratios = {}
    for name in ('program', 'compiled'):
        if 'ms_per_image' in runs.get('test_step', {}) and 'ms_per_image' in runs.get(name, {}):
            ratios[f'{name}_speedup_over_test_step'] = round(
                runs['test_step']['ms_per_image'] / runs[name]['ms_per_image'], 3)
    speedup = ratios.get('compiled_speedup_over_test_step')
    environment = dict(device=torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu',
                       torch=torch.__version__, cuda=torch.version.cuda)
    return dict(
        environment=environment, command='python -m benchmarks.deploy.bench_compiled_package '
        + ' '.join(sys.argv[1:] if argv is None else argv),
        settings=dict(config=osp.relpath(args.config, REPO), trained_checkpoint=trained,
                      image_size=args.image_size, images=args.images, warmup=args.warmup,
                      device=args.device),
        runs=runs, ratios=ratios,
        goals=dict(compiled_at_least_1_5x_test_step=(
            None if speedup is None else speedup >= GOAL_COMPILED_OVER_TEST_STEP)))


if __name__ == '__main__':
    main()
