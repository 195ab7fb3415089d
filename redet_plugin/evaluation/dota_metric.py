"""DOTAMetric: per-class AP at rotated IoU thresholds (DOTA Task1), mAP, optional submission files."""
from collections import OrderedDict
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger
from mmdet.registry import METRICS
from terminaltables import AsciiTable

from redet_plugin.utils.registration import register

from ..datasets.dota import difficult_rule_text
from .patch_merge import merge_patch_detections
from .rotated_ap import eval_rotated_map
from .task1_files import Task1Writer


def _field(container, key: str):
    """Reads `key` from an InstanceData or from the dict mmengine's Evaluator makes of it."""
    return container[key] if isinstance(container, dict) else getattr(container, key)


def _as_array(boxes, width: int) -> np.ndarray:
    tensor = getattr(boxes, 'tensor', boxes)
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().cpu().numpy()
    return np.asarray(tensor, dtype=np.float32).reshape(-1, width)


def _labels(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.int64).reshape(-1)


@register(METRICS)
class DOTAMetric(BaseMetric):
    """VOC-style mAP for rotated boxes; the data set's ignored objects are ignored.

    Which objects those are is the data set's rule: RedetDOTADataset's `ignore_difficult`
    (True: difficult objects ignored, as DOTA's devkit; False: kept as ground truth, as
    mmrotate). The evaluation log names the rule in use.

    Every figure equals mmrotate's DOTAMetric with the same options (its eval_mode is our
    ap_method; tests/test_interop/test_mmrotate_metric_parity.py), up to rounding: mmrotate
    rounds each APxx to 3 decimals, we round every figure to 4. One case differs, where mmrotate
    departs from DOTA's devkit and mmdet's eval_map: on an image without any non-ignored ground
    truth (of any class), mmrotate's get_cls_results drops the image's ignored objects too, so
    detections of them count as false positives there; here they are ignored on every image.
    Several figures at once (HRSC2016's VOC07 and VOC12 AP): a list of metrics with distinct
    `prefix` (configs/_base_/datasets/hrsc.py).

    Args:
        iou_thrs: rotated-IoU threshold(s); 'mAP' is the mean of the per-threshold mAPs.
        ap_method: '11points' (VOC07, DOTA's default) or 'area'.
        format_only: only write the submission files (test set without annotations).
        outfile_prefix: folder for DOTA Task1 submission files `Task1_<class>.txt`
            (lines `image_id score x1 y1 ... x4 y4`); None writes nothing.
        merge_patches: before writing, merge the detections of split patches
            (`<image>__<rate>__<x>___<y>`, (x, y) in the image scaled by rate; mmrotate's
            `<image>__<size>__<x>___<y>` read as rate 1: structures/patch_grid.py) into their
            full image with rotated NMS (`nms_iou_thr`): boxes shifted by (x, y), then divided
            by rate, so the patches of all rates of a multi-scale split merge into one image.
    Predictions: data samples with pred_instances.bboxes ((N, 5) tensor or RotatedBoxes), .scores,
    .labels; ground truth: gt_instances and ignored_instances (bboxes, labels) as mmdet's
    PackDetInputs makes them (load the annotations after Resize in the test pipeline so they
    stay in original image coordinates, as the predictions are).
    """

    default_prefix: Optional[str] = 'dota'

    def __init__(self, iou_thrs: Union[float, Sequence[float]] = 0.5, ap_method: str = '11points',
                 format_only: bool = False, outfile_prefix: Optional[str] = None,
                 merge_patches: bool = False, nms_iou_thr: float = 0.1,
                 collect_device: str = 'cpu', prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.iou_thrs = [iou_thrs] if isinstance(iou_thrs, (int, float)) else list(iou_thrs)
        if not self.iou_thrs or any(not 0 < t <= 1 for t in self.iou_thrs):
            raise ValueError(f'DOTAMetric: iou_thrs must be in (0, 1], got {iou_thrs}')
        if ap_method not in ('11points', 'area'):
            raise ValueError(f"DOTAMetric: ap_method must be '11points' or 'area', got {ap_method!r}")
        if format_only and outfile_prefix is None:
            raise ValueError('DOTAMetric: format_only=True needs outfile_prefix (where to write)')
        self.ap_method, self.format_only = ap_method, format_only
        self.outfile_prefix, self.merge_patches, self.nms_iou_thr = outfile_prefix, merge_patches, nms_iou_thr

    def process(self, data_batch, data_samples: Sequence) -> None:
        for sample in data_samples:
            pred = _field(sample, 'pred_instances')
            result = dict(img_id=_field(sample, 'img_id'),
                          pred_bboxes=_as_array(_field(pred, 'bboxes'), 5),
                          pred_scores=_as_array(_field(pred, 'scores'), 1).reshape(-1),
                          pred_labels=_labels(_field(pred, 'labels')))
            if not self.format_only:
                has_gt = 'gt_instances' in sample if isinstance(sample, dict) else hasattr(sample, 'gt_instances')
                if not has_gt:
                    raise ValueError(f"DOTAMetric: data sample {result['img_id']!r} has no gt_instances: load "
                                     "annotations in the test pipeline, or set format_only=True")
                gt = _field(sample, 'gt_instances')
                ignored = sample.get('ignored_instances', None) if isinstance(sample, dict) \
                    else getattr(sample, 'ignored_instances', None)
                result['gt'] = dict(bboxes=_as_array(_field(gt, 'bboxes'), 5), labels=_labels(_field(gt, 'labels')))
                if ignored is not None and len(_field(ignored, 'labels')) > 0:
                    result['gt'].update(bboxes_ignore=_as_array(_field(ignored, 'bboxes'), 5),
                                        labels_ignore=_labels(_field(ignored, 'labels')))
                else:
                    result['gt'].update(bboxes_ignore=np.zeros((0, 5), np.float32),
                                        labels_ignore=np.zeros(0, np.int64))
            self.results.append(result)

    def compute_metrics(self, results: List[dict]) -> dict:
        logger = MMLogger.get_current_instance()
        classes = self.dataset_meta['classes']
        if self.outfile_prefix is not None:
            self.write_submission(results, classes, self.outfile_prefix)
            logger.info(f'DOTA Task1 submission files written to {self.outfile_prefix}')
        if self.format_only:
            return OrderedDict()
        logger.info(f'difficult objects: {difficult_rule_text(self.dataset_meta.get("ignore_difficult"))}')
        detections = [self._per_class(r, len(classes)) for r in results]
        annotations = [r['gt'] for r in results]
        metrics, maps = OrderedDict(), []
        for thr in self.iou_thrs:
            per_class = eval_rotated_map(detections, annotations, len(classes), thr, self.ap_method)
            evaluated = [c['ap'] for c in per_class if c['num_gts'] > 0]
            class_map = float(np.mean(evaluated)) if evaluated else 0.0
            self._log_table(per_class, classes, thr, class_map, logger)
            metrics[f'AP{int(round(thr * 100))}'] = round(class_map, 4)
            maps.append(class_map)
        metrics['mAP'] = round(float(np.mean(maps)), 4)
        return metrics

    @staticmethod
    def _per_class(result: dict, num_classes: int) -> List[np.ndarray]:
        dets = np.concatenate([result['pred_bboxes'], result['pred_scores'][:, None]], axis=1)
        return [dets[result['pred_labels'] == c] for c in range(num_classes)]

    def _log_table(self, per_class, classes, thr: float, class_map: float, logger) -> None:
        rows = [['class', 'gts', 'dets', 'recall', f'AP{int(round(thr * 100))}']]
        for name, stats in zip(classes, per_class):
            rows.append([name, stats['num_gts'], stats['num_dets'], f"{stats['recall']:.3f}", f"{stats['ap']:.3f}"])
        rows.append(['mAP', '', '', '', f'{class_map:.3f}'])
        table = AsciiTable(rows)
        table.inner_footing_row_border = True
        logger.info(f'\nrotated IoU {thr} ({self.ap_method}):\n' + table.table)

    def write_submission(self, results: List[dict], classes: Sequence[str], folder: str) -> None:
        """Writes `Task1_<class>.txt` files, one line `image_id score x1 y1 ... x4 y4` per detection."""
        per_image = [(r['img_id'], r['pred_bboxes'], r['pred_scores'], r['pred_labels']) for r in results]
        if self.merge_patches:
            per_image = merge_patch_detections(per_image, iou_thr=self.nms_iou_thr)
        with Task1Writer(folder, classes) as writer:
            for img_id, boxes, scores, labels in per_image:
                writer.add(img_id, boxes, scores, labels)
