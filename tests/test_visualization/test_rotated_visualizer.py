"""Rotated boxes drawn as polygons by the mmdet visualizer."""
import math

import cv2
import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures import RotatedBoxes, rbox2qbox
from redet_plugin.visualization import RotatedDetLocalVisualizer

BOX = [60.0, 50.0, 60.0, 20.0, math.pi / 6]


def edge_and_centre(img):
    """Is something drawn on the box's first corner, and is its centre left untouched?"""
    corner = rbox2qbox(torch.tensor([BOX]))[0, :2].round().long().tolist()
    patch = img[corner[1] - 1:corner[1] + 2, corner[0] - 1:corner[0] + 2]
    return patch.max() > 0, img[50, 60].max() == 0


def test_visualizer_draws_rotated_gt_and_predictions(tmp_path):
    visualizer = RotatedDetLocalVisualizer(name='test_rotated_visualizer')
    visualizer.dataset_meta = dict(classes=('plane', 'ship'), palette=[(255, 0, 0), (0, 255, 0)])
    s = DetDataSample()
    s.gt_instances = InstanceData(bboxes=RotatedBoxes(torch.tensor([BOX])), labels=torch.tensor([1]))
    s.pred_instances = InstanceData(bboxes=torch.tensor([BOX]), scores=torch.tensor([0.9]), labels=torch.tensor([0]))
    out_file = tmp_path / 'drawn.png'
    visualizer.add_datasample('x', np.zeros((100, 120, 3), np.uint8), s, out_file=str(out_file), pred_score_thr=0.3)
    drawn = cv2.imread(str(out_file))[..., ::-1]
    assert drawn.shape == (100, 240, 3)  # ground truth | prediction
    for half in (drawn[:, :120], drawn[:, 120:]):
        on_edge, centre_empty = edge_and_centre(half)
        assert on_edge and centre_empty
