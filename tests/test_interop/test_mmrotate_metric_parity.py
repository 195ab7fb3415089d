"""RedetDOTAMetric gives mmrotate's DOTAMetric figures (same options: our ap_method is its
eval_mode) on random jittered detections: several classes, ignored ground truths, objects found
twice, false positives, images without objects; 11-point and area AP, one IoU threshold and
0.50:0.05:0.95 (per-threshold AP and their mean). And the HRSC2016 evaluator of
configs/_base_/datasets/hrsc.py reports each figure as mmrotate's DOTAMetric with the matching
options.

mmrotate rounds each APxx it returns to 3 decimals (ours: every figure to 4); its unrounded
per-threshold mAPs are read from the eval_rbbox_map calls its metric makes, so the figures are
compared within 1e-4. mmrotate's eval_rbbox_map spawns a pool of 4 processes per call; it runs
in-process here (the same function on the same arguments, serially).

One documented difference (mmrotate departs from DOTA's devkit and mmdet's eval_map there): on
an image without any non-ignored ground truth, mmrotate's get_cls_results drops the ignored
ones too, so detections of them are false positives; ours ignores them on every image.
"""
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import Evaluator
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

from tests._helpers import REPO, register_mmrotate

CLASSES = ('plane', 'ship', 'storage-tank', 'small-vehicle')
COCO_THRS = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]


class _SerialPool:
    """multiprocessing's Pool as eval_rbbox_map uses it, run in this process."""

    def starmap(self, fn, args):
        return [fn(*a) for a in args]

    def close(self):
        pass


class _SerialContext:
    def Pool(self, processes=None):  # noqa: N802 (multiprocessing's name)
        return _SerialPool()


@pytest.fixture
def mmrotate_metric(monkeypatch):
    """make(**options) -> (mmrotate's DOTAMetric, list the unrounded per-threshold mAPs of its
    evaluation go to)."""
    init_default_scope('mmdet')
    register_mmrotate()
    import mmrotate.evaluation.functional.mean_ap as mean_ap
    import mmrotate.evaluation.metrics.dota_metric as dota_metric
    monkeypatch.setattr(mean_ap, 'get_context', lambda method=None: _SerialContext())
    unrounded = []
    eval_rbbox_map = dota_metric.eval_rbbox_map

    def recording(*args, **kwargs):
        mean_ap_value, per_class = eval_rbbox_map(*args, **kwargs)
        unrounded.append(mean_ap_value)
        return mean_ap_value, per_class

    monkeypatch.setattr(dota_metric, 'eval_rbbox_map', recording)

    def make(**options):
        unrounded.clear()
        return dota_metric.DOTAMetric(**options), unrounded

    return make


def random_samples(seed=0, images=40, classes=CLASSES, all_ignored=False):
    """Data samples as mmengine's Evaluator hands them to the metrics (dicts): per image 0-14
    objects of random classes, a quarter of them ignored; each object found 0-2 times (jittered
    by about a pixel and 0.03 rad), 0-6 false positives; image 5 has no objects at all, image 9
    only non-ignored ones. With all_ignored, images 3 and 17 hold ignored objects only."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(images):
        n = 0 if i == 5 else int(rng.integers(3, 15))
        gt = np.stack([rng.uniform(40, 560, n), rng.uniform(40, 560, n), rng.uniform(12, 60, n),
                       rng.uniform(6, 30, n), rng.uniform(-np.pi / 2, np.pi / 2, n)], 1).astype(np.float32)
        labels = rng.integers(0, len(classes), n)
        ignored = rng.random(n) < 0.25
        if i == 9:
            ignored[:] = False
        if all_ignored and i in (3, 17):
            ignored[:] = True
        boxes, det_labels = [], []
        for box, label in zip(gt, labels):
            for _ in range(int(rng.choice([0, 1, 1, 1, 1, 2]))):
                boxes.append(box + rng.normal(0, [1.0, 1.0, 1.5, 1.0, 0.03]))
                det_labels.append(label)
        for _ in range(int(rng.integers(0, 7))):
            boxes.append([rng.uniform(20, 580), rng.uniform(20, 580), rng.uniform(10, 50), rng.uniform(6, 25),
                          rng.uniform(-1.5, 1.5)])
            det_labels.append(int(rng.integers(len(classes))))
        boxes = np.asarray(boxes, np.float32).reshape(-1, 5)
        scores = rng.uniform(0.05, 1, len(boxes)).astype(np.float32)

        def instances(keep):
            return dict(bboxes=torch.from_numpy(gt[keep]), labels=torch.from_numpy(labels[keep]))

        samples.append(dict(img_id=f'img{i}', gt_instances=instances(~ignored),
                            ignored_instances=instances(ignored),
                            pred_instances=dict(bboxes=torch.from_numpy(boxes), scores=torch.from_numpy(scores),
                                                labels=torch.from_numpy(np.asarray(det_labels, np.int64)))))
    return samples


def evaluate(metrics, samples, classes=CLASSES):
    evaluator = Evaluator(metrics)
    evaluator.dataset_meta = dict(classes=classes)
    evaluator.process(samples)
    return evaluator.evaluate(len(samples))


def thresholds(iou_thrs):
    return [iou_thrs] if isinstance(iou_thrs, float) else iou_thrs


def assert_same_figures(ours, theirs, unrounded, iou_thrs, prefix='dota'):
    """Same metric names; each APxx and the mean within 1e-4 of mmrotate's unrounded figure."""
    assert set(ours) == set(theirs)
    names = [f'{prefix}/AP{int(round(t * 100))}' for t in thresholds(iou_thrs)]
    assert set(ours) == set(names) | {f'{prefix}/mAP'}
    assert len(unrounded) == len(names)
    for name, value in zip(names, unrounded):
        assert abs(ours[name] - value) <= 1e-4, (name, ours[name], value)
        assert abs(theirs[name] - value) <= 5e-4 + 1e-9  # mmrotate's own 3-decimal rounding
    assert abs(ours[f'{prefix}/mAP'] - theirs[f'{prefix}/mAP']) <= 1e-4
    assert abs(theirs[f'{prefix}/mAP'] - np.mean(unrounded)) <= 1e-9


@pytest.mark.parametrize('eval_mode', ['11points', 'area'])
@pytest.mark.parametrize('iou_thrs', [0.5, 0.75, COCO_THRS], ids=['iou50', 'iou75', 'iou50-95'])
def test_every_figure_equals_mmrotates(mmrotate_metric, eval_mode, iou_thrs):
    samples = random_samples()
    theirs_metric, unrounded = mmrotate_metric(iou_thrs=iou_thrs, eval_mode=eval_mode)
    theirs = evaluate([theirs_metric], samples)
    ours = evaluate(dict(type='RedetDOTAMetric', iou_thrs=iou_thrs, ap_method=eval_mode), samples)
    assert_same_figures(ours, theirs, unrounded, iou_thrs)
    # the data are not trivial: some detections are missed or wrong, and stricter IoU costs AP
    aps = [ours[f'dota/AP{int(round(t * 100))}'] for t in thresholds(iou_thrs)]
    assert 0.3 < aps[0] < 0.99
    assert aps == sorted(aps, reverse=True)


def test_images_with_ignored_objects_only(mmrotate_metric, monkeypatch):
    """mmrotate drops the ignored objects of an image without other ground truth (its detections
    of them become false positives); ours ignores them as on any other image, and equals
    mmrotate with that branch taken out of its get_cls_results."""
    import mmrotate.evaluation.functional.mean_ap as mean_ap
    samples = random_samples(seed=3, all_ignored=True)
    assert all(len(samples[i]['gt_instances']['labels']) == 0 < len(samples[i]['ignored_instances']['labels'])
               for i in (3, 17))
    ours = evaluate(dict(type='RedetDOTAMetric', iou_thrs=COCO_THRS, ap_method='11points'), samples)
    theirs_metric, unrounded = mmrotate_metric(iou_thrs=COCO_THRS, eval_mode='11points')
    theirs = evaluate([theirs_metric], samples)
    assert theirs['dota/mAP'] < ours['dota/mAP'] - 1e-3  # their extra false positives

    def get_cls_results_keeping_ignored(det_results, annotations, class_id, box_type):
        return ([img_res[class_id] for img_res in det_results],
                [ann['bboxes'][ann['labels'] == class_id] for ann in annotations],
                [ann['bboxes_ignore'][ann['labels_ignore'] == class_id] for ann in annotations])

    monkeypatch.setattr(mean_ap, 'get_cls_results', get_cls_results_keeping_ignored)
    theirs_metric, unrounded = mmrotate_metric(iou_thrs=COCO_THRS, eval_mode='11points')
    assert_same_figures(ours, evaluate([theirs_metric], samples), unrounded, COCO_THRS)


def test_hrsc_evaluator_reports_mmrotates_figures(mmrotate_metric):
    """configs/_base_/datasets/hrsc.py's evaluator: VOC07 11-point AP at 0.50:0.05:0.95 (AP50:
    ReDet's paper; mAP, AP50, AP75: mmrotate's model zoo) and VOC12 area AP50, each equal to
    mmrotate's DOTAMetric with those options."""
    cfg = Config.fromfile(osp.join(REPO, 'configs/_base_/datasets/hrsc.py'))
    assert cfg.test_evaluator == cfg.val_evaluator
    classes = ('ship',)
    samples = random_samples(seed=7, images=30, classes=classes)
    ours = evaluate(cfg.val_evaluator, samples, classes)
    expected = {'hrsc_voc07': dict(eval_mode='11points', iou_thrs=COCO_THRS),
                'hrsc_voc12': dict(eval_mode='area', iou_thrs=0.5)}
    for prefix, options in expected.items():
        theirs_metric, unrounded = mmrotate_metric(prefix=prefix, **options)
        theirs = evaluate([theirs_metric], samples, classes)
        assert_same_figures({k: v for k, v in ours.items() if k.startswith(prefix + '/')}, theirs, unrounded,
                            options['iou_thrs'], prefix)
    assert {'hrsc_voc07/AP50', 'hrsc_voc07/AP75', 'hrsc_voc07/mAP', 'hrsc_voc12/AP50'} <= set(ours)
    # the two ways of reading AP50 differ on these detections, hence both are reported
    assert ours['hrsc_voc07/AP50'] != ours['hrsc_voc12/AP50']
