"""Where a compiled package's time per image goes (tools/export.py --compile, run by
redet_plugin.deploy.load as users get it), for variants of the export (inductor settings, dtype).

For each variant the package is compiled, loaded, and timed per image (medians after warm-up):
  call_ms     DeployedDetector(image) end to end (upload, forward, detections read back)
  upload_ms   the image to the device (as __call__ does it)
  forward_ms  the package's forward alone on an image already on the device
and its longest kernels per forward (torch.profiler; with the CUDA graph, the replay's kernels),
with the device's idle time between them.

    python -m benchmarks.profiling.profile_compiled_package --out profile_package.json
        [--variants default float16 max_autotune] [--checkpoint CKPT]
(from the repository root; the images are those of benchmarks/deploy/bench_compiled_package.py.)
"""
import argparse
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch

from benchmarks._initial_checkpoint import save_initial_checkpoint
from benchmarks._timing import write_json
from benchmarks.deploy.bench_compiled_package import (
    add_model_and_image_arguments, load_images, package_runner, timed_paths)
from benchmarks.profiling.profile_detector import top_kernels

VARIANTS = {  # export_detector's arguments
    'default': {},
    'max_autotune': dict(inductor_configs={'max_autotune': True}),
    'coordinate_descent': dict(inductor_configs={'coordinate_descent_tuning': True}),
    'float16': dict(dtype='float16'),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file for the results')
    add_model_and_image_arguments(p)
    p.add_argument('--variants', nargs='+', default=['default', 'float16', 'max_autotune'],
                   choices=sorted(VARIANTS))
    p.add_argument('--work-dir', help='where the packages are written (default: a temporary one)')
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error('needs a CUDA device (torch sees none here)')
    args.device = 'cuda'
    return args


def median_ms(fn, count):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 3)


def profile_variant(args, name, images, work_dir):
    from redet_plugin.deploy.deployed_detector import _as_image_tensor
    _, compile_s, detector = package_runner(args, work_dir, name,
                                            dict(compile=True, **VARIANTS[name]))
    for image in images[:args.warmup]:
        detector(image)
    timed = images[args.warmup:]
    calls = iter(timed * 3)
    upload = lambda: detector._uploaded(detector._padded(_as_image_tensor(next(calls))))  # noqa: E731
    with torch.inference_mode():  # (as DeployedDetector runs the forward: its graph's tensors)
        return measured(detector, upload, calls, timed, compile_s)


def measured(detector, upload, calls, timed, compile_s):
    # (the forward alone, from the second image on a replay of the graph that the first
    # image's call captured with load's settings)
    pixels = upload()
    return dict(
        compile_s=round(compile_s, 1), cuda_graph=detector.cuda_graph, tf32=detector.tf32,
        call_ms=median_ms(lambda: detector(next(calls)), len(timed)),
        upload_ms=median_ms(upload, len(timed)),
        forward_ms=median_ms(lambda: detector._forward(pixels), len(timed)),
        kernels=top_kernels(lambda: detector._forward(pixels), calls=3, count=30))


def main(argv=None):
    args = parse_args(argv)
    import redet_plugin.mm  # noqa: F401  (the config's components)
    paths = timed_paths(args.data_root, args.image_size, args.images + args.warmup)
    images = load_images(paths, args.image_size)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='redet_packages_')
    if not args.checkpoint:
        args.checkpoint = osp.join(work_dir, 'initial.pth')
        save_initial_checkpoint(args.config, args.checkpoint)
    result = dict(environment=dict(device=torch.cuda.get_device_name(), torch=torch.__version__),
                  command='python -m benchmarks.profiling.profile_compiled_package '
                  + ' '.join(sys.argv[1:] if argv is None else argv), variants={})
    for name in args.variants:
        try:
            result['variants'][name] = profile_variant(args, name, images, work_dir)
        except Exception as error:  # (one variant failing must not lose the others)
            result['variants'][name] = dict(error=f'{type(error).__name__}: {error}'[:500])
        print(name, {k: v for k, v in result['variants'][name].items() if k != 'kernels'},
              flush=True)
        write_json(args.out, result)  # after each variant: a time limit keeps the earlier ones
        torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
