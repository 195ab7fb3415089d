"""The rule for difficult objects: RedetDOTADataset's ignore_difficult=False (mmrotate's rule)
gives mmrotate's ground truth in training and mmrotate's DOTAMetric mAP in evaluation; True (DOTA
devkit's rule) ignores them. The evaluation log names the rule."""
import logging

import cv2
import numpy as np
import pytest
import torch
from mmengine.evaluator import Evaluator
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import DOTADataset
from redet_plugin.structures import rbox2qbox

from tests._helpers import register_mmrotate

CLASSES = ('plane', 'ship', 'small-vehicle')


def random_dota_folder(root, seed=0, images=6):
    """DOTA-format images and labels; about a third of the objects difficult (1, or 2 as the
    splitter marks cut objects); image 'only_difficult' holds difficult objects only.
    Returns {img_id: [(rbox, label, difficulty)]}."""
    rng = np.random.default_rng(seed)
    (root / 'images').mkdir(parents=True)
    (root / 'labelTxt').mkdir()
    truth = {}
    for i in range(images):
        img_id = 'only_difficult' if i == 0 else f'img{i}'
        objects = []
        for _ in range(int(rng.integers(8, 16))):
            rbox = [rng.uniform(40, 360), rng.uniform(40, 360), rng.uniform(12, 50), rng.uniform(8, 30),
                    rng.uniform(-np.pi / 2, np.pi / 2)]
            difficulty = int(rng.choice([0, 0, 1, 2])) if i else int(rng.choice([1, 2]))
            objects.append((rbox, int(rng.integers(len(CLASSES))), difficulty))
        lines = []
        for rbox, label, difficulty in objects:
            corners = rbox2qbox(torch.tensor([rbox], dtype=torch.float64)).reshape(-1).tolist()
            lines.append(' '.join(f'{v:.1f}' for v in corners) + f' {CLASSES[label]} {difficulty}\n')
        (root / 'labelTxt' / f'{img_id}.txt').write_text(''.join(lines))
        cv2.imwrite(str(root / 'images' / f'{img_id}.png'), np.zeros((400, 400, 3), np.uint8))
        truth[img_id] = objects
    return truth


def random_detections(truth, seed=1):
    """The same detections for both metrics: most objects found (jittered), some twice, and
    false positives; {img_id: (boxes (N, 5), scores, labels)}."""
    rng = np.random.default_rng(seed)
    detections = {}
    for img_id, objects in truth.items():
        boxes, labels = [], []
        for rbox, label, _ in objects:
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):
                boxes.append(np.asarray(rbox) + rng.normal(0, [2, 2, 2, 2, 0.05]))
                labels.append(label)
        for _ in range(5):
            boxes.append([rng.uniform(20, 380), rng.uniform(20, 380), 30, 15, rng.uniform(-1.5, 1.5)])
            labels.append(int(rng.integers(len(CLASSES))))
        detections[img_id] = (np.asarray(boxes, np.float32), rng.uniform(0.05, 1, len(boxes)).astype(np.float32),
                              np.asarray(labels, np.int64))
    return detections


def sample(img_id, gt, ignored, detection):
    """A data sample as mmengine's Evaluator hands it to the metrics (a dict)."""
    boxes, scores, labels = detection

    def instances(rboxes, labels):
        return dict(bboxes=torch.as_tensor(np.asarray(rboxes, np.float32)).reshape(-1, 5),
                    labels=torch.as_tensor(np.asarray(labels, np.int64)))

    return dict(img_id=img_id, gt_instances=instances(*gt), ignored_instances=instances(*ignored),
                pred_instances=dict(bboxes=torch.from_numpy(boxes), scores=torch.from_numpy(scores),
                                    labels=torch.from_numpy(labels)))


def split_by_flag(instances, box_of):
    gt = ([box_of(i) for i in instances if not i['ignore_flag']], [i['bbox_label'] for i in instances if not i['ignore_flag']])
    ignored = ([box_of(i) for i in instances if i['ignore_flag']], [i['bbox_label'] for i in instances if i['ignore_flag']])
    return gt, ignored


def our_map(root, detections, ignore_difficult):
    init_default_scope('mmdet')  # another test in this process may have left mmrotate's scope
    dataset = DOTADataset(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='images'),
                          metainfo=dict(classes=CLASSES), test_mode=True, pipeline=[],
                          ignore_difficult=ignore_difficult)
    evaluator = Evaluator(dict(type='RedetDOTAMetric'))
    evaluator.dataset_meta = dataset.metainfo
    samples = []
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        gt, ignored = split_by_flag(info['instances'], lambda inst: inst['bbox'])
        samples.append(sample(info['img_id'], gt, ignored, detections[info['img_id']]))
    evaluator.process(samples)
    return evaluator.evaluate(len(samples))


def mmrotate_map(root, detections):
    """mmrotate's DOTADataset (its default diff_thr=100) and DOTAMetric; its quadrilaterals
    converted to rotated boxes by mmrotate's own qbox -> rbox (as its ConvertBoxType does)."""
    register_mmrotate()
    from mmrotate.datasets import DOTADataset as MMRotateDOTADataset
    from mmrotate.evaluation import DOTAMetric as MMRotateDOTAMetric
    from mmrotate.structures.bbox import qbox2rbox as mmrotate_qbox2rbox
    dataset = MMRotateDOTADataset(data_root=str(root), ann_file='labelTxt/', data_prefix=dict(img_path='images/'),
                                  metainfo=dict(classes=CLASSES), test_mode=True, pipeline=[])
    metric = MMRotateDOTAMetric()
    metric.dataset_meta = dict(classes=CLASSES)
    samples = []
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        gt, ignored = split_by_flag(
            info['instances'], lambda inst: mmrotate_qbox2rbox(torch.tensor(inst['bbox'])).tolist())
        samples.append(sample(info['img_id'], gt, ignored, detections[info['img_id']]))
    metric.process({}, samples)
    return metric.compute_metrics(metric.results), dataset


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('dota')
    truth = random_dota_folder(root)
    return root, random_detections(truth)


def test_mmrotate_rule_gives_mmrotates_map(data):
    root, detections = data
    theirs, _ = mmrotate_map(root, detections)
    ours = our_map(root, detections, ignore_difficult=False)
    devkit = our_map(root, detections, ignore_difficult=True)
    # mmrotate rounds AP50 to 3 decimals and leaves mAP unrounded; ours rounds both to 4
    assert abs(ours['dota/mAP'] - theirs['mAP']) <= 5e-5 + 1e-9
    assert abs(ours['dota/AP50'] - theirs['AP50']) <= 5e-4 + 5e-5 + 1e-9
    # the rule matters on this data: the devkit's rule gives another mAP
    assert abs(devkit['dota/mAP'] - theirs['mAP']) > 0.01


@pytest.mark.parametrize('ignore_difficult,text', [
    (True, 'difficult objects: ignored (DOTA devkit)'),
    (False, 'difficult objects: kept as ground truth (mmrotate)')])
def test_evaluation_log_names_the_rule(data, ignore_difficult, text):
    root, detections = data
    logger = MMLogger.get_instance('difficult_rule_log')
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    try:
        our_map(root, detections, ignore_difficult)
    finally:
        logger.removeHandler(handler)
    assert text in records


@pytest.mark.parametrize('ignore_difficult', [True, False])
def test_difficult_objects_in_training(data, ignore_difficult):
    """Devkit's rule: difficult objects reach the model as ignored_instances (no target), and an
    image with difficult objects only is left out by filter_empty_gt. mmrotate's rule: they are
    gt_instances, as in mmrotate's DOTADataset."""
    root, detections = data
    init_default_scope('mmdet')
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
                dict(type='PackDetInputs')]
    dataset = DOTADataset(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='images'),
                          metainfo=dict(classes=CLASSES), pipeline=pipeline,
                          filter_cfg=dict(filter_empty_gt=True), ignore_difficult=ignore_difficult)
    truth_lines = {p.stem: [line.split() for line in p.read_text().splitlines()]
                   for p in (root / 'labelTxt').glob('*.txt')}
    ids = [dataset.get_data_info(i)['img_id'] for i in range(len(dataset))]
    assert ('only_difficult' in ids) == (not ignore_difficult)
    _, mmrotate_dataset = mmrotate_map(root, detections)
    mmrotate_gts = {info['img_id']: sum(not inst['ignore_flag'] for inst in info['instances'])
                    for info in (mmrotate_dataset.get_data_info(i) for i in range(len(mmrotate_dataset)))}
    for i, img_id in enumerate(ids):
        packed = dataset[i]['data_samples']
        difficult = sum(int(fields[9]) >= 1 for fields in truth_lines[img_id])
        assert 0 < difficult < len(truth_lines[img_id]) or img_id == 'only_difficult'
        if ignore_difficult:
            assert len(packed.ignored_instances) == difficult
            assert len(packed.gt_instances) == len(truth_lines[img_id]) - difficult
        else:
            assert len(packed.ignored_instances) == 0
            assert len(packed.gt_instances) == len(truth_lines[img_id]) == mmrotate_gts[img_id]
