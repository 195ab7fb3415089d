"""Where our test forward and mmrotate's part, on one mmrotate checkpoint, image by image.

Builds mmrotate's ReDet from the config it was trained with and ours from the
mmrotate-compatible config, loads the same checkpoint into both, and runs each project's own
test data path (data set, pipeline, data preprocessor) on the first --images images. For each
variant of ours (the config's defaults, then each default turned off) it compares, stage by
stage: the network inputs, the FPN features, the RPN proposals, the final detections (matched
one to one: same label, score within --score-tol, every box number within --box-rtol of its
size), and the mAP@0.5 of both models' detections under our metric with mmrotate's rule for
difficult objects.

    python -m benchmarks.detector.mmrotate_parity --mmrotate-config C --checkpoint CKPT
        --our-config C2 --out parity.json [--images 20] [--device cuda]
(repo root; a diagnostic: its JSON says where the detections part, the tests hold the result.)
"""
import argparse
import copy
import json
import os.path as osp
import time

import torch

from redet_plugin.testing import tf32

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
OUR_CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--mmrotate-config', required=True, help='the config mmrotate trained with')
    p.add_argument('--checkpoint', required=True, help="mmrotate's checkpoint")
    p.add_argument('--our-config', default=OUR_CONFIG, help='ours, its test_dataloader the '
                   'annotated images mmrotate tests on')
    p.add_argument('--images', type=int, default=20)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--score-tol', type=float, default=1e-3)
    p.add_argument('--box-rtol', type=float, default=1e-3)
    p.add_argument('--variants', nargs='+', default=None)
    p.add_argument('--out', required=True)
    return p.parse_args(argv)


def test_dataset(cfg, scope):
    from mmengine.registry import DATASETS, DefaultScope
    dataset_cfg = copy.deepcopy(cfg.test_dataloader.dataset)
    with DefaultScope.overwrite_default_scope(scope):
        return DATASETS.build(dataset_cfg)


def build_theirs(config, checkpoint, device):
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmengine.runner import load_checkpoint
    from mmrotate.registry import MODELS
    cfg = Config.fromfile(config)
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope('mmrotate'):
        model = MODELS.build(cfg.model)
    # in train mode, as its Runner saved it (e2cnn then holds no eval-mode filter buffers)
    load_checkpoint(model.train(), checkpoint, map_location='cpu', strict=True)
    return model.to(device).eval(), test_dataset(cfg, 'mmrotate')


def build_ours(config, checkpoint, device, options):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmengine.runner import load_checkpoint
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(options)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
    return model.to(device).eval(), cfg


def batch_of(model, item):
    from mmengine.dataset import pseudo_collate
    return model.data_preprocessor(pseudo_collate([item]), False)


def tensors(feats):
    return [getattr(f, 'tensor', f) for f in feats]


def stages(model, data, ours: bool):
    """inputs, FPN features, proposals (boxes, scores) and detections of one image."""
    from mmdet.structures.bbox import get_box_tensor
    from redet_plugin.structures.padded_results import cut_padding
    inputs, samples = data['inputs'], data['data_samples']
    with torch.no_grad():
        feats = model.extract_feat(inputs)
        proposals = model.rpn_head.predict(feats, samples, rescale=False)
        if ours:
            proposals = cut_padding(proposals)
        dets = model.predict(inputs, copy.deepcopy(samples))[0].pred_instances
    props = proposals[0]
    return dict(inputs=inputs.float(), feats=[f.float().contiguous() for f in tensors(feats)],
                proposals=(get_box_tensor(props.bboxes).float(), props.scores.float()),
                dets=(get_box_tensor(dets.bboxes).float(), dets.scores.float(), dets.labels))


def match_count(ours, theirs, score_tol, box_rtol):
    """How many of our detections have a one-to-one counterpart in theirs (same label, score
    within score_tol, each box number within box_rtol of the box's size)."""
    (boxes, scores, labels), (tb, ts, tl) = [[t.double().cpu() if t.is_floating_point() else
                                              t.cpu() for t in x] for x in (ours, theirs)]
    if len(scores) == 0 or len(ts) == 0:
        return 0
    scale = boxes[:, 2:4].abs().amax(dim=1).clamp(min=1)[:, None]
    box_diff = ((boxes[:, None, :4] - tb[None, :, :4]).abs() / scale[:, :, None]).amax(-1)
    angle = (boxes[:, None, 4] - tb[None, :, 4]).abs()
    box_diff = torch.maximum(box_diff, angle)
    score_diff = (scores[:, None] - ts[None, :]).abs()
    ok = (labels[:, None] == tl[None, :]) & (score_diff <= score_tol) & (box_diff <= box_rtol)
    cost = torch.where(ok, score_diff / score_tol + box_diff / box_rtol, torch.inf)
    free = torch.ones(len(ts), dtype=torch.bool)
    matched = 0
    for i in range(len(scores)):
        row = torch.where(free, cost[i], torch.inf)
        j = int(row.argmin())
        if torch.isfinite(row[j]):
            free[j] = False
            matched += 1
    return matched


def proposal_overlap(ours, theirs):
    """Fraction of their proposals equal to one of ours (every coordinate within 1e-2 px)."""
    (boxes, _), (tb, _) = ours, theirs
    if len(tb) == 0:
        return None
    boxes, tb = boxes.double().cpu(), tb.double().cpu()
    found = 0
    for chunk in tb.split(512):
        diff = (chunk[:, None] - boxes[None]).abs().amax(-1)
        found += int((diff.amin(1) <= 1e-2).sum())
    return found / len(tb)


def compare(ours, theirs, args):
    rel = lambda a, b: float((a - b).norm() / b.norm().clamp(min=1e-12))  # noqa: E731
    return dict(
        inputs_max_abs=float((ours['inputs'] - theirs['inputs']).abs().max())
        if ours['inputs'].shape == theirs['inputs'].shape else f"shapes {tuple(ours['inputs'].shape)} "
        f"vs {tuple(theirs['inputs'].shape)}",
        feats_rel=[rel(a, b) for a, b in zip(ours['feats'], theirs['feats'])],
        proposals=(len(ours['proposals'][1]), len(theirs['proposals'][1])),
        proposals_found=proposal_overlap(ours['proposals'], theirs['proposals']),
        dets=(len(ours['dets'][1]), len(theirs['dets'][1])),
        dets_matched=match_count(ours['dets'], theirs['dets'], args.score_tol, args.box_rtol))


def mean_ap(gt_items, dets, classes):
    from mmengine.structures import InstanceData
    from redet_plugin.evaluation import DOTAMetric
    metric = DOTAMetric(iou_thrs=0.5, ap_method='11points')
    metric.dataset_meta = dict(classes=classes, ignore_difficult=False)
    for item, (boxes, scores, labels) in zip(gt_items, dets):
        sample = item['data_samples']
        sample.pred_instances = InstanceData(bboxes=boxes.cpu(), scores=scores.cpu(),
                                             labels=labels.cpu())
        metric.process({}, [sample.to_dict()])
    return metric.compute_metrics(metric.results)['mAP']


VARIANTS = {
    'defaults': ({}, True),
    'tf32_off': ({}, False),
    'no_tf32_predict': ({'model.tf32_predict': False}, True),
    'no_channels_last': ({'model.channels_last': False}, True),
    'no_predict_graph': ({'model.cuda_graph_predict': False}, True),
    'plain': ({'model.channels_last': False, 'model.cuda_graphs': False}, False),
}


def main(argv=None):
    args = parse_args(argv)
    # mmrotate's modules in its registries (no default scope: each side builds in its own); they
    # need mmrotate's torchvision, as mmrotate's own tools that trained the checkpoint did
    from mmrotate.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    import redet_plugin.mm  # noqa: F401
    from mmengine.config import Config
    start = time.time()
    theirs, their_data = build_theirs(args.mmrotate_config, args.checkpoint, args.device)
    classes = list(their_data.metainfo['classes'])
    # our data set with annotations (the config's test pipeline); mmrotate lists its files in
    # the file system's order, so its images are matched by name
    our_cfg = Config.fromfile(args.our_config)
    our_data = test_dataset(our_cfg, 'mmdet')
    n = min(args.images, len(our_data))
    gt_items = [our_data[i] for i in range(n)]
    their_index = {osp.basename(their_data.get_data_info(i)['img_path']): i
                   for i in range(len(their_data))}
    their_items = [their_data[their_index[osp.basename(item['data_samples'].img_path)]]
                   for item in gt_items]
    result = dict(device=args.device, images=n, checkpoint=args.checkpoint, variants={})
    their_runs = {}
    for enabled in (True, False):
        with tf32(enabled):
            their_runs[enabled] = [stages(theirs, batch_of(theirs, item), False)
                                   for item in their_items]
    theirs.cpu()
    for name in args.variants or VARIANTS:
        options, with_tf32 = VARIANTS[name]
        if args.device == 'cpu' and (options or not with_tf32):
            continue
        ours, _ = build_ours(args.our_config, args.checkpoint, args.device, options)
        with tf32(with_tf32):
            runs = [stages(ours, batch_of(ours, item), True) for item in gt_items]
        reference = their_runs[with_tf32]
        per_image = [compare(o, t, args) for o, t in zip(runs, reference)]
        total = sum(p['dets'][0] for p in per_image)
        matched = sum(p['dets_matched'] for p in per_image)
        summary = dict(
            tf32=with_tf32, options=options,
            dets_ours=total, dets_theirs=sum(p['dets'][1] for p in per_image),
            dets_matched=matched,
            worst_feats_rel=max(max(p['feats_rel']) for p in per_image),
            min_proposals_found=min(p['proposals_found'] or 1 for p in per_image),
            mAP_ours=mean_ap(gt_items, [r['dets'] for r in runs], classes),
            mAP_theirs=mean_ap(gt_items, [r['dets'] for r in reference], classes),
            per_image=per_image)
        result['variants'][name] = summary
        print(f"{name}: dets {total} ours / {summary['dets_theirs']} theirs, matched {matched}; "
              f"feats rel <= {summary['worst_feats_rel']:.2e}; proposals found >= "
              f"{summary['min_proposals_found']:.3f}; mAP {summary['mAP_ours']:.4f} ours, "
              f"{summary['mAP_theirs']:.4f} theirs", flush=True)
        result['wall_s'] = round(time.time() - start)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
        del ours
        if args.device != 'cpu':
            torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
