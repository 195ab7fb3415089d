"""DOTA evaluation: rotated-IoU VOC mAP metric and the merge of split-patch detections."""
from .dota_metric import DOTAMetric
from ..structures.patch_grid import parse_patch_id, patch_id
from .patch_merge import merge_patch_detections
from .rotated_ap import average_precision, eval_rotated_map, match_detections, rotated_iou

__all__ = ['DOTAMetric', 'merge_patch_detections', 'parse_patch_id', 'patch_id',
           'average_precision', 'eval_rotated_map', 'match_detections', 'rotated_iou']
