"""The picture tools/infer.py writes: the detections at or above the score threshold, drawn by
the visualizer (RotatedDetLocalVisualizer) in the data set's RGB palette, on the BGR image."""
import math

import numpy as np
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.inference.detector import DetectionResult
from redet_plugin.inference.image_source import ImageSource
from redet_plugin.inference.outputs import render_detections
from redet_plugin.structures import rbox2qbox

DRAWN = [60.0, 50.0, 60.0, 20.0, math.pi / 6]
BELOW = [150.0, 60.0, 40.0, 20.0, 0.0]


def test_render_detections_draws_the_kept_boxes_in_the_palette():
    image = np.zeros((100, 200, 3), np.uint8)
    result = DetectionResult('x', 100, 200, np.array([DRAWN, BELOW], np.float32),
                             np.array([0.3, 0.29], np.float32), np.array([1, 0]), ('a', 'b'))
    picture = render_detections(ImageSource(image), result, score_thr=0.3,
                                palette=[(0, 255, 0), (255, 0, 0)])
    assert picture.shape == image.shape and picture.dtype == np.uint8 and image.max() == 0
    corners = rbox2qbox(torch.tensor([DRAWN]))[0].reshape(4, 2).numpy()
    for i in range(4):  # each side, in palette[1] (red, channel 2 of BGR)
        x, y = np.round((corners[i] + corners[(i + 1) % 4]) / 2).astype(int)
        blue, green, red = picture[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3).max(0)
        assert red > 150 and blue == green == 0
    assert picture[50, 60].max() == 0  # the inside is left alone
    assert picture[45:76, 125:176].max() == 0  # the box below the threshold is not drawn


def test_render_detections_scales_the_boxes_to_the_smaller_picture():
    image = np.zeros((100, 200, 3), np.uint8)
    result = DetectionResult('x', 100, 200, np.array([DRAWN], np.float32), np.array([0.9], np.float32),
                             np.array([0]), ('a',))
    picture = render_detections(ImageSource(image), result, max_side=100)
    assert picture.shape == (50, 100, 3) and picture.max() > 0
    assert picture[25, 30].max() == 0  # the centre, at half the size
