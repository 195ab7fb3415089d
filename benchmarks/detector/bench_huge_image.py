"""One huge image, detected by patches: ours (RotatedDetector, what tools/infer.py runs, and
tools/infer.py as a command) against mmrotate's inference_detector_by_patches (what its
demo/huge_image_demo.py calls), on the same mmrotate checkpoint, patch grid and merge.

    python -m benchmarks.detector.bench_huge_image --checkpoint CKPT --mmrotate-config C
        --our-config C2 --data-root DIR [--tiles 5] [--out huge_image.json]

The image is a mosaic of tiles x tiles images of the annotated set under DIR (DOTA layout,
val/images + val/labelTxt; 1024² images make a 5120² mosaic for --tiles 5), so its ground truth is
known and its objects are at the scale the checkpoint was trained at; the patch grid cuts through
them as it cuts a real huge image. Both detect with 1024 patches overlapping by 200 (mmrotate:
step 824), scale 1.0 and a class-wise rotated NMS at IoU 0.1, one patch a forward as mmrotate's
demo runs (bs=1; ours also at --batch-size). Timed: the first call (warm-up included) and the
median of --repeats later calls, each ended by a CUDA synchronisation; ours also from the image
already decoded, and the decoding alone (OpenCV's and ours); the command, end to end in its own
process. AP50 of both against the mosaic's ground truth (our metric, VOC07 11 points, every
object a gt as mmrotate's rule). --skip-mmrotate times ours alone (e.g. on the CPU, where
mmcv's RiRoIAlignRotated does not run).
"""
import argparse
import json
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from benchmarks.detector.bench_detector_vs_mmrotate import environment

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MERGE_IOU = 0.1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--checkpoint', required=True, help="mmrotate's checkpoint")
    p.add_argument('--our-config', required=True,
                   help='the mmrotate-compatible config with the checkpoint\'s classes')
    p.add_argument('--mmrotate-config', help='the config mmrotate trained with')
    p.add_argument('--data-root', required=True, help='annotated images (DOTA layout, val/)')
    p.add_argument('--tiles', type=int, default=5)
    p.add_argument('--patch-size', type=int, default=1024)
    p.add_argument('--patch-overlap', type=int, default=200)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--batch-size', type=int, default=8, help='ours, besides bs=1')
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--skip-mmrotate', action='store_true')
    p.add_argument('--out', required=True)
    return p.parse_args(argv)


def make_mosaic(data_root: str, tiles: int, work: str, classes) -> tuple:
    """(path of the mosaic PNG, its (height, width), gts dict(bboxes (N, 5) le90, labels
    (N,))) from the first tiles² images of data_root/val."""
    import cv2
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope('mmdet')
    dataset = DATASETS.build(dict(
        type='RedetDOTADataset', data_root=data_root, ann_file='val/labelTxt/',
        data_prefix=dict(img_path='val/images/'), metainfo=dict(classes=tuple(classes)),
        test_mode=True, pipeline=[]))
    if len(dataset) < tiles * tiles:
        raise SystemExit(f'--tiles {tiles}: {data_root}/val holds {len(dataset)} images, fewer '
                         f'than {tiles * tiles}')
    infos = [dataset.get_data_info(i) for i in range(tiles * tiles)]
    height, width = cv2.imread(infos[0]['img_path']).shape[:2]
    mosaic = np.zeros((tiles * height, tiles * width, 3), np.uint8)
    boxes, labels = [], []
    for index, info in enumerate(infos):
        row, col = divmod(index, tiles)
        image = cv2.imread(info['img_path'])
        if image.shape[:2] != (height, width):
            raise SystemExit(f"{info['img_path']}: the tiles must share one size")
        mosaic[row * height:(row + 1) * height, col * width:(col + 1) * width] = image
        for inst in info['instances']:
            cx, cy, w, h, t = inst['bbox']
            boxes.append([cx + col * width, cy + row * height, w, h, t])
            labels.append(inst['bbox_label'])
    path = osp.join(work, 'mosaic.png')
    cv2.imwrite(path, mosaic)
    return path, mosaic.shape[:2], dict(bboxes=np.array(boxes, np.float32).reshape(-1, 5),
                      labels=np.array(labels, np.int64),
                      bboxes_ignore=np.zeros((0, 5), np.float32),
                      labels_ignore=np.zeros((0,), np.int64))


def ap50(boxes, scores, labels, gts, num_classes) -> float:
    """mAP@0.5 over the classes with objects (VOC07 11 points)."""
    from redet_plugin.evaluation.rotated_ap import eval_rotated_map
    dets = [np.concatenate([boxes[labels == c], scores[labels == c, None]], axis=1)
            .astype(np.float32).reshape(-1, 6) for c in range(num_classes)]
    per_class = eval_rotated_map([dets], [gts], num_classes, iou_thr=0.5)
    aps = [r['ap'] for r in per_class if r['num_gts'] > 0]
    return float(np.mean(aps)) if aps else float('nan')


def timed(call, repeats: int, device: str) -> tuple:
    """(first call's seconds, median of `repeats` later calls, the last result)."""
    times, result = [], None
    for _ in range(repeats + 1):
        if device.startswith('cuda'):
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        if device.startswith('cuda'):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:]), result


def our_detector(args, batch_size: int):
    """RotatedDetector as tools/infer.py builds it, with this run's patches and merge."""
    from redet_plugin.inference import RotatedDetector
    return RotatedDetector(args.our_config, args.checkpoint, device=args.device,
                           patch_size=args.patch_size, patch_overlap=args.patch_overlap,
                           batch_size=batch_size, merge_iou_thr=MERGE_IOU)


def run_ours(args, detector, image: str) -> dict:
    """The image from its file, as users call it; and from the decoded image (the model,
    the patches and the merge without the decoding)."""
    from redet_plugin.inference import ImageSource
    first, median, result = timed(lambda: detector.predict(image), args.repeats, args.device)
    source = ImageSource(image)
    _, decoded, _ = timed(lambda: detector.predict(source), args.repeats, args.device)
    return dict(first_s=first, median_s=median, decoded_median_s=decoded,
                detections=(result.boxes, result.scores, result.labels))


def decoding_s(args, image: str) -> dict:
    """Median seconds to decode the image file: OpenCV's whole decode (mmrotate's read:
    mmcv.imread), and ours (ImageSource until its last row is read; the runs above read the
    top rows while the rest is decoded)."""
    import cv2
    from redet_plugin.inference import ImageSource

    def ours():
        source = ImageSource(image)
        source.read(source.height - 1, 0, 1, 1)
    opencv = timed(lambda: cv2.imread(image, cv2.IMREAD_COLOR), args.repeats, 'cpu')[1]
    return dict(opencv_read_s=round(opencv, 4), our_decode_s=round(timed(ours, args.repeats, 'cpu')[1], 4))


def run_mmrotate(args, image: str) -> dict:
    from mmdet.apis import init_detector
    from mmrotate.apis import inference_detector_by_patches
    from mmrotate.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    model = init_detector(args.mmrotate_config, args.checkpoint, device=args.device)
    nms = dict(type='nms_rotated', iou_threshold=MERGE_IOU)

    def call():
        return inference_detector_by_patches(model, image, [args.patch_size],
                                             [args.patch_size - args.patch_overlap], [1.0], nms)
    first, median, result = timed(call, args.repeats, args.device)
    pred = result.pred_instances
    boxes = pred.bboxes.tensor if hasattr(pred.bboxes, 'tensor') else pred.bboxes
    return dict(first_s=first, median_s=median, detections=(
        boxes.cpu().numpy(), pred.scores.cpu().numpy(), pred.labels.cpu().numpy()))


def run_command(args, image: str, work: str) -> float:
    """tools/infer.py on the image, end to end in its own process (seconds)."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, 'tools/infer.py', image, args.our_config,
                          args.checkpoint, '--out-dir', osp.join(work, 'infer'), '--no-vis',
                          '--device', args.device, '--patch-size', str(args.patch_size),
                          '--patch-overlap', str(args.patch_overlap), '--merge-iou-thr', str(MERGE_IOU)],
                         cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f'tools/infer.py: exit {run.returncode}\n{run.stderr[-3000:]}')
    return time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    if not args.skip_mmrotate and not args.mmrotate_config:
        raise SystemExit('--mmrotate-config is needed unless --skip-mmrotate')
    import redet_plugin.mm  # noqa: F401  (registers the mm layer)
    with tempfile.TemporaryDirectory(prefix='huge_image_') as work:
        result = measure(args, work)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result['runs'], indent=1))
    return result


def measure(args, work):
    """Times ours (and mmrotate's) on a mosaic written under `work`; returns the result."""
    detector = our_detector(args, 1)
    classes = detector.classes  # (the checkpoint's: the mosaic's labels follow them)
    image, image_size, gts = make_mosaic(args.data_root, args.tiles, work, classes)
    runs = dict(ours_bs1=run_ours(args, detector, image))
    if args.batch_size != 1:
        runs[f'ours_bs{args.batch_size}'] = run_ours(args, our_detector(args, args.batch_size),
                                                     image)
    if not args.skip_mmrotate:
        runs['mmrotate'] = run_mmrotate(args, image)
    result = dict(
        command=' '.join(sys.argv), tiles=args.tiles, image_size=list(map(int, image_size)),
        num_gts=int(len(gts['labels'])), patch_size=args.patch_size, overlap=args.patch_overlap,
        merge_iou_thr=MERGE_IOU, **decoding_s(args, image),
        environment=environment(int(args.device.startswith('cuda'))), runs={})
    for name, run in runs.items():
        boxes, scores, labels = run.pop('detections')
        run.update(num_detections=int(len(scores)), ap50=ap50(boxes, scores, labels, gts,
                                                               len(classes)))
        result['runs'][name] = {k: (round(v, 4) if isinstance(v, float) else v)
                                for k, v in run.items()}
    result['runs']['tools/infer.py'] = dict(end_to_end_s=round(run_command(args, image, work), 3))
    if 'mmrotate' in runs:
        theirs = result['runs']['mmrotate']
        for name in [n for n in result['runs'] if n.startswith('ours_')]:
            ours = result['runs'][name]
            ours['speedup_vs_mmrotate'] = round(theirs['median_s'] / ours['median_s'], 2)
            ours['ap50_minus_mmrotate'] = round(ours['ap50'] - theirs['ap50'], 4)
    return result


if __name__ == '__main__':
    main()
