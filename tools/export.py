"""Export a trained ReDet as one file that runs without the training stack (docs/deploy.md).

    python tools/export.py CONFIG CHECKPOINT --out model.pt2 [--image-size H W]
        [--device cpu|cuda] [--dtype float32|float16] [--compile] [--cfg-options ...]

The file holds the whole test forward of one H x W image (uint8 BGR pixels in, rotated
detections out) and runs with torch and redet_plugin.ops only:

    from redet_plugin.deploy import load
    found = load('model.pt2')(cv2.imread('image.png'))

--compile writes an AOTInductor-compiled package (machine code for this device and torch
version; minutes to make) instead of the exported program. --dtype float16 runs the forward
under fp16 autocast, as tools/test.py --amp (GPU only).
"""
import argparse
import os.path as osp
import sys
import time

from redet_plugin.utils.transformers_hidden import transformers_hidden

with transformers_hidden(sys.argv[1:] if __name__ == '__main__' else None):
    from mmengine.config import DictAction

    from redet_plugin.engine.cli import fail


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export a rotated detector to one file')
    parser.add_argument('config', help='config file of the model')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='the package to write (e.g. model.pt2)')
    parser.add_argument('--image-size', type=int, nargs=2, default=[1024, 1024], metavar=('H', 'W'),
                        help='size of the images the package takes (smaller ones are padded)')
    parser.add_argument('--device', default='cpu', help='cpu or cuda: where the package runs')
    parser.add_argument('--dtype', default='float32', choices=('float32', 'float16'),
                        help='float16: the forward under fp16 autocast (--device cuda only)')
    parser.add_argument('--compile', action='store_true',
                        help='AOTInductor-compile the program (for this device and torch version)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.test_cfg.rcnn.max_per_img=500')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.config):
        fail(f'config file {args.config!r} does not exist')
    if not osp.isfile(args.checkpoint):
        fail(f'checkpoint {args.checkpoint!r} does not exist')
    if min(args.image_size) < 1:
        fail(f'--image-size: expected two positive integers H W, got {args.image_size}')
    if args.device not in ('cpu', 'cuda'):
        fail(f"--device: expected cpu or cuda, got {args.device!r}")
    if not osp.isdir(osp.dirname(osp.abspath(args.out))):
        fail(f'--out: the folder {osp.dirname(osp.abspath(args.out))!r} does not exist')

    from redet_plugin.inference import CheckpointMismatchError
    from redet_plugin.inference.export import export_detector
    start = time.perf_counter()
    try:
        path = export_detector(args.config, args.checkpoint, args.out,
                               image_size=tuple(args.image_size), device=args.device,
                               dtype=args.dtype, compile=args.compile, cfg_options=args.cfg_options)
    except (CheckpointMismatchError, ValueError) as error:
        fail(str(error))
    kind = 'compiled package' if args.compile else 'exported program'
    print(f'{args.dtype} {kind} for {args.image_size[0]}x{args.image_size[1]} images on '
          f'{args.device} written to {path} ({time.perf_counter() - start:.0f} s)', file=sys.stderr)
    return path


if __name__ == '__main__':
    main()
