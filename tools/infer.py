"""Detect rotated objects in new images of any size (patches for large ones); docs/inference.md.

    python tools/infer.py INPUTS... CONFIG CHECKPOINT --out-dir DIR [--patch-size 1024]
    python tools/infer.py INPUTS... --model model.pt2 --out-dir DIR [the same options]
        [--patch-overlap 200] [--scales 1.0 ...] [--score-thr 0.05] [--merge-iou-thr 0.1]
        [--batch-size N] [--device cuda|cpu] [--dota-submission] [--vis-max-size 2048]
        [--vis-score-thr 0.3] [--no-vis] [--equivariant] [--amp]

INPUTS are images, folders (their images) or globs. --model runs a package that tools/export.py
wrote (redet_plugin.deploy) instead of a config and checkpoint. Writes DIR/preds/<name>.txt (DOTA format:
`x1 y1 ... x4 y4 class score`, the image's pixels) and DIR/vis/<name>.jpg; --dota-submission
writes DIR/Task1_<class>.txt instead of DIR/preds. An image that fails is named on one line; the
others still run, and the failures are listed at the end (exit status 1).
"""
import argparse
import glob
import os
import os.path as osp
import sys

from redet_plugin.utils.transformers_hidden import transformers_hidden

with transformers_hidden(sys.argv[1:] if __name__ == '__main__' else None):
    from mmengine.config import DictAction

    from redet_plugin.engine.cli import fail

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.tif', '.tiff', '.bmp', '.ppm', '.pgm', '.webp')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Detect rotated objects in images of any size')
    parser.add_argument('inputs', nargs='+', metavar='INPUTS... CONFIG CHECKPOINT',
                        help='images, folders or globs (quote globs), then the config file and '
                        'the checkpoint of the model (without --model)')
    parser.add_argument('--model', help='an exported package (tools/export.py) to run instead of '
                        'a config and checkpoint')
    parser.add_argument('--out-dir', required=True, help='folder for preds/, vis/ (or Task1 files)')
    parser.add_argument('--patch-size', type=int, default=1024, help='side of the square patches')
    parser.add_argument('--patch-overlap', type=int, default=200, help='pixels shared by neighbouring patches')
    parser.add_argument('--scales', type=float, nargs='+', default=[1.0],
                        help='image scales to detect at (patches are cut at each)')
    parser.add_argument('--score-thr', type=float, default=0.05, help='lowest score kept')
    parser.add_argument('--merge-iou-thr', type=float, default=0.1,
                        help='IoU of the class-wise rotated NMS merging the patches')
    parser.add_argument('--batch-size', type=int, default=1, help='patches per forward pass')
    parser.add_argument('--device', default=None, help='cuda, cuda:N or cpu (default: cuda if available)')
    parser.add_argument('--dota-submission', action='store_true',
                        help='write DIR/Task1_<class>.txt (DOTA Task1) instead of DIR/preds/')
    parser.add_argument('--vis-max-size', type=int, default=2048, help='longest side of the pictures')
    parser.add_argument('--vis-score-thr', type=float, default=0.3, help='lowest score drawn')
    parser.add_argument('--no-vis', action='store_true', help='write no pictures')
    parser.add_argument('--equivariant', action='store_true',
                        help="keep e2cnn's modules (by default the backbone and neck run as plain "
                        'convolutions with folded batch norms: the same detections, faster)')
    parser.add_argument('--amp', action='store_true',
                        help='fp16 autocast, as tools/test.py --amp; needs a GPU')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.test_cfg.rcnn.max_per_img=500')
    args = parser.parse_args(argv)
    args.config = args.checkpoint = None
    if args.model is None:
        if len(args.inputs) < 3:
            parser.error('expected INPUTS... CONFIG CHECKPOINT (or INPUTS... --model PACKAGE)')
        args.inputs, (args.config, args.checkpoint) = args.inputs[:-2], args.inputs[-2:]
    elif args.cfg_options or args.equivariant or args.amp:
        parser.error('--cfg-options, --equivariant and --amp apply to a config, not to --model '
                     '(the export fixed them: tools/export.py --dtype float16)')
    return args


def expand_inputs(inputs):
    """(image paths, failures): folders give their images (sorted), globs their matches;
    an input that names nothing is a failure."""
    paths, failures = [], []
    for item in inputs:
        if osp.isdir(item):
            found = sorted(osp.join(item, f) for f in os.listdir(item) if f.lower().endswith(IMAGE_SUFFIXES))
            if not found:
                failures.append(f'{item}: no images ({", ".join(IMAGE_SUFFIXES)}) in the folder')
        elif glob.has_magic(item):
            found = sorted(p for p in glob.glob(item) if osp.isfile(p))
            if not found:
                failures.append(f'{item}: no file matches')
        else:
            found = [item]  # a missing file fails when it is read, in order
        paths.extend(found)
    return paths, failures


def main(argv=None):
    args = parse_args(argv)
    from tqdm import tqdm

    from redet_plugin.evaluation.task1_files import Task1Writer
    from redet_plugin.deploy import PackageMismatchError
    from redet_plugin.inference import (CheckpointMismatchError, ImageReadError, ImageSource,
                                        RotatedDetector, default_device)
    from redet_plugin.inference.outputs import render_detections, write_dota_predictions

    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        fail(f'checkpoint {args.checkpoint!r} does not exist')
    if args.vis_max_size < 1:
        fail(f'--vis-max-size must be positive, got {args.vis_max_size}')
    if args.amp and not (args.device or default_device()).startswith('cuda'):
        fail('--amp needs a GPU (fp16 autocast runs on a CUDA device); ' +
             (f'--device is {args.device}' if args.device else 'none is available'))
    patching = dict(patch_size=args.patch_size, patch_overlap=args.patch_overlap, scales=args.scales,
                    batch_size=args.batch_size, score_thr=args.score_thr,
                    merge_iou_thr=args.merge_iou_thr)
    try:
        if args.model is not None:
            from redet_plugin.inference.package_detector import PackageDetector
            detector = PackageDetector(args.model, device=args.device, **patching)
        else:
            detector = RotatedDetector(args.config, args.checkpoint, device=args.device,
                                       cfg_options=args.cfg_options, plain=not args.equivariant,
                                       amp=args.amp, **patching)
    except CheckpointMismatchError as error:
        fail(str(error))
    except (ValueError, PackageMismatchError) as error:  # an argument out of range, no config
        fail(str(error))                                 # file, a package of another version

    paths, failures = expand_inputs(args.inputs)
    preds_dir, vis_dir = osp.join(args.out_dir, 'preds'), osp.join(args.out_dir, 'vis')
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.dota_submission:
        os.makedirs(preds_dir, exist_ok=True)
    if not args.no_vis:
        os.makedirs(vis_dir, exist_ok=True)
    submission = Task1Writer(args.out_dir, detector.classes) if args.dota_submission else None
    names, done = {}, 0
    images = tqdm(paths, desc='images', unit='img', position=0)
    for path in images:
        name = osp.splitext(osp.basename(path))[0]
        if name in names:
            failures.append(f'{path}: its name {name!r} is taken by {names[name]} (outputs are named by it)')
            tqdm.write(f'error: {failures[-1]}', file=sys.stderr)
            continue
        try:
            source = ImageSource(path)
            with tqdm(desc=name, unit='patch', position=1, leave=False) as bar:
                def progress(count, total, bar=bar):
                    bar.total = total
                    bar.update(count - bar.n)
                result = detector.predict(source, progress=progress)
        except ImageReadError as error:
            tqdm.write(f'error: {error}', file=sys.stderr)
            failures.append(str(error))
            continue
        names[name] = path
        if submission is not None:
            submission.add(name, result.boxes, result.scores, result.labels)
        else:
            write_dota_predictions(osp.join(preds_dir, f'{name}.txt'), result)
        if not args.no_vis:
            import cv2
            picture = render_detections(source, result, args.vis_max_size, args.vis_score_thr, detector.palette)
            cv2.imwrite(osp.join(vis_dir, f'{name}.jpg'), picture)
        done += 1
    if submission is not None:
        submission.close()
    images.close()
    where = args.out_dir if args.dota_submission else preds_dir
    print(f'{done} image{"s" if done != 1 else ""} done, detections in {where}', file=sys.stderr)
    if failures:
        print(f'{len(failures)} failed:', file=sys.stderr)
        for line in failures:
            print(f'  {line}', file=sys.stderr)
    return failures


if __name__ == '__main__':
    sys.exit(1 if main() else 0)
