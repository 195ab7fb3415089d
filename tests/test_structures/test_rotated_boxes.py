"""RotatedBoxes ('redet_rbox') and the plain rbox/qbox/hbox helpers."""
import math

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from mmdet.structures.bbox import HorizontalBoxes, get_box_type
from mmdet.structures.mask import BitmapMasks, PolygonMasks
from shapely.geometry import Polygon

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures import (RotatedBoxes, hbox2rbox, hbox_as_prior, norm_angle,
                                     qbox2rbox, rbox2hbox, rbox2qbox, regularize_rboxes,
                                     rescale_rboxes)


def random_rboxes(n, seed=0, regular=True):
    g = torch.Generator().manual_seed(seed)
    ctr = torch.rand(n, 2, generator=g) * 200 + 20
    wh = torch.rand(n, 2, generator=g) * 60 + 4
    theta = (torch.rand(n, 1, generator=g) - 0.5) * 4 * math.pi
    boxes = torch.cat([ctr, wh, theta], dim=1).double()
    return regularize_rboxes(boxes) if regular else boxes


def corners(boxes):
    return rbox2qbox(torch.as_tensor(boxes, dtype=torch.float64)).reshape(-1, 4, 2)


def assert_same_rectangles(a, b, atol=1e-3):
    """Same corner sets (any order): the same rectangles whatever their parametrization."""
    ca, cb = corners(a), corners(b)
    dist = (ca[:, :, None, :] - cb[:, None, :, :]).norm(dim=-1)
    assert dist.min(dim=2).values.max() < atol and dist.min(dim=1).values.max() < atol


def test_registered_as_rbox():
    assert get_box_type('redet_rbox') == ('redet_rbox', RotatedBoxes)
    assert RotatedBoxes(torch.zeros(0, 5)).tensor.shape == (0, 5)


def test_norm_angle_range_and_period():
    theta = torch.linspace(-10, 10, 1001, dtype=torch.float64)
    out = norm_angle(theta)
    assert (out >= -math.pi / 2).all() and (out < math.pi / 2).all()
    turns = (out - theta) / math.pi  # whole half turns: the same rectangle
    assert torch.allclose(turns, turns.round(), atol=1e-9)


def test_regularize_keeps_rectangle_and_convention():
    raw = random_rboxes(200, seed=1, regular=False)
    reg = regularize_rboxes(raw)
    assert (reg[:, 2] >= reg[:, 3]).all()
    assert (reg[:, 4] >= -math.pi / 2).all() and (reg[:, 4] < math.pi / 2).all()
    assert_same_rectangles(raw, reg, atol=1e-9)


def test_rbox_qbox_round_trip():
    boxes = random_rboxes(300, seed=2)
    back = qbox2rbox(rbox2qbox(boxes))
    assert_same_rectangles(boxes, back, atol=2e-3)
    elongated = (boxes[:, 2] > 1.1 * boxes[:, 3])  # for these the parameters are unique
    assert torch.allclose(back[elongated], boxes[elongated], atol=2e-3)


def test_qbox_corner_order_is_clockwise_on_screen():
    q = rbox2qbox(torch.tensor([[10.0, 20.0, 4.0, 2.0, 0.0]]))
    assert q.tolist() == [[8.0, 19.0, 12.0, 19.0, 12.0, 21.0, 8.0, 21.0]]


def test_qbox2rbox_of_non_rectangle_is_min_area_rect():
    quad = np.array([[0, 0, 10, 0, 12, 5, 0, 5]], dtype=np.float64)
    rbox = qbox2rbox(quad)
    poly = Polygon(corners(rbox)[0].numpy())
    assert poly.buffer(1e-3).contains(Polygon(quad.reshape(4, 2)))
    assert poly.area == pytest.approx(cv2.contourArea(cv2.boxPoints(cv2.minAreaRect(
        quad.reshape(4, 2).astype(np.float32)))), rel=1e-4)


def test_rbox2hbox_encloses_corners():
    boxes = random_rboxes(100, seed=3)
    c = corners(boxes)
    expected = torch.cat([c.min(dim=1).values, c.max(dim=1).values], dim=1)
    assert torch.allclose(rbox2hbox(boxes), expected, atol=1e-9)


def test_hbox_rbox_converters():
    hboxes = HorizontalBoxes(torch.tensor([[0.0, 0.0, 10.0, 4.0], [5.0, 5.0, 7.0, 15.0]]))
    rboxes = hboxes.convert_to('redet_rbox')
    assert isinstance(rboxes, RotatedBoxes)
    assert torch.allclose(rboxes.tensor[0], torch.tensor([5.0, 2.0, 10.0, 4.0, 0.0]))
    assert torch.allclose(rboxes.tensor[1], torch.tensor([6.0, 10.0, 10.0, 2.0, -math.pi / 2]))
    assert torch.allclose(rboxes.convert_to('hbox').tensor, hboxes.tensor, atol=1e-5)
    assert torch.allclose(hbox2rbox(rbox2hbox(rboxes.tensor)), rboxes.tensor, atol=1e-5)


def test_properties():
    boxes = RotatedBoxes(torch.tensor([[1.0, 2.0, 6.0, 3.0, 0.4]]))
    assert boxes.centers.tolist() == [[1.0, 2.0]]
    assert boxes.areas.tolist() == [18.0] and boxes.widths.tolist() == [6.0] and boxes.heights.tolist() == [3.0]


@pytest.mark.parametrize('direction', ['horizontal', 'vertical', 'diagonal'])
def test_flip_matches_flipped_corners(direction):
    h, w = 300, 400
    boxes = random_rboxes(50, seed=4)
    flipped = RotatedBoxes(boxes.clone())
    flipped.flip_((h, w), direction)
    c = corners(boxes)
    if direction in ('horizontal', 'diagonal'):
        c[..., 0] = w - c[..., 0]
    if direction in ('vertical', 'diagonal'):
        c[..., 1] = h - c[..., 1]
    assert_same_rectangles(flipped.tensor, qbox2rbox(c.reshape(-1, 8)))
    again = RotatedBoxes(flipped.tensor.clone())
    again.flip_((h, w), direction)
    assert_same_rectangles(again.tensor, boxes, atol=1e-6)
    with pytest.raises(ValueError, match='direction'):
        flipped.flip_((h, w), 'sideways')


@settings(max_examples=30, deadline=None)
@given(angle=st.floats(-360, 360), cx=st.floats(0, 300), cy=st.floats(0, 300))
def test_rotate_matches_cv2_rotation_of_corners(angle, cx, cy):
    boxes = random_rboxes(10, seed=5)
    rotated = RotatedBoxes(boxes.clone())
    rotated.rotate_((cx, cy), angle)
    # mmdet's rule (HorizontalBoxes.rotate_): cv2.getRotationMatrix2D(center, -angle) maps points.
    matrix = torch.as_tensor(cv2.getRotationMatrix2D((cx, cy), -angle, 1), dtype=torch.float64)
    c = corners(boxes)
    mapped = c @ matrix[:, :2].T + matrix[:, 2]
    assert_same_rectangles(rotated.tensor, qbox2rbox(mapped.reshape(-1, 8)), atol=5e-3)
    back = RotatedBoxes(rotated.tensor.clone())
    back.rotate_((cx, cy), -angle)
    assert_same_rectangles(back.tensor, boxes, atol=1e-6)


def test_project_rigid_equals_rotate_translate():
    boxes = random_rboxes(20, seed=6)
    matrix = np.eye(3)
    matrix[:2] = cv2.getRotationMatrix2D((50.0, 60.0), -30.0, 1)
    matrix[:2, 2] += [5.0, -7.0]
    projected = RotatedBoxes(boxes.clone())
    projected.project_(matrix)
    expected = RotatedBoxes(boxes.clone())
    expected.rotate_((50.0, 60.0), 30.0)
    expected.translate_((5.0, -7.0))
    assert_same_rectangles(projected.tensor, expected.tensor, atol=5e-3)


def test_rescale_and_resize():
    boxes = random_rboxes(30, seed=7)
    uniform = RotatedBoxes(boxes.clone())
    uniform.rescale_((2.0, 2.0))
    c = corners(boxes) * 2
    assert_same_rectangles(uniform.tensor, qbox2rbox(c.reshape(-1, 8)), atol=1e-4)
    # Non-uniform scaling is exact for axis-aligned boxes.
    axis = RotatedBoxes(torch.tensor([[10.0, 20.0, 8.0, 4.0, 0.0], [10.0, 20.0, 8.0, 4.0, -math.pi / 2]]))
    axis.rescale_((2.0, 0.5))
    assert_same_rectangles(axis.tensor, torch.tensor([[20.0, 10.0, 16.0, 2.0, 0.0], [20.0, 10.0, 8.0, 4.0, 0.0]]))
    resized = RotatedBoxes(torch.tensor([[10.0, 20.0, 8.0, 4.0, 0.3]]))
    resized.resize_((0.5, 2.0))
    assert torch.allclose(resized.tensor, regularize_rboxes(torch.tensor([[10.0, 20.0, 4.0, 8.0, 0.3]])))
    with pytest.raises(ValueError, match='scale_factor'):
        resized.rescale_((1.0,))


def test_rescale_unequal_scales_on_axis_aligned_boxes():
    boxes = torch.tensor([[10., 20., 8., 4., 0.], [10., 20., 8., 4., math.pi / 2]])
    scaled = rescale_rboxes(boxes, 2.0, 3.0)
    assert torch.allclose(scaled[0], torch.tensor([20., 60., 16., 12., 0.]))
    assert_same_rectangles(scaled[1:], torch.tensor([[20., 60., 24., 8., math.pi / 2]]), atol=1e-5)


def test_rescale_keeps_the_longer_scaled_side_and_the_area():
    # w side along (1, 1), h side along (-1, 1); x doubled: w side -> (4, 2), h side -> (-2, 1)
    box = torch.tensor([[0.0, 0.0, 2 * math.sqrt(2), math.sqrt(2), math.pi / 4]], dtype=torch.float64)
    scaled = rescale_rboxes(box, 2.0, 1.0)
    expected = [0.0, 0.0, 2 * math.sqrt(5), 8 / (2 * math.sqrt(5)), math.atan2(1, 2)]
    assert torch.allclose(scaled[0], torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # here the h side becomes the longer one: it keeps its direction and becomes w (le90)
    tall = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.3]], dtype=torch.float64)
    scaled = rescale_rboxes(tall, 1.0, 5.0)
    h_side = torch.tensor([-math.sin(0.3), 5 * math.cos(0.3)], dtype=torch.float64) * 2
    assert scaled[0, 2].item() == pytest.approx(h_side.norm().item())
    assert (scaled[0, 2] * scaled[0, 3]).item() == pytest.approx(4.0 * 2.0 * 5.0)
    long_side = torch.stack([torch.cos(scaled[0, 4]), torch.sin(scaled[0, 4])])
    assert abs(torch.dot(long_side, h_side / h_side.norm()).item()) == pytest.approx(1.0)


def test_rescale_fits_the_scaled_parallelogram():
    """Under unequal scales a rotated box's true image is a parallelogram: the rescaled box keeps
    its area and overlaps it well (IoU >= 0.6 here; keeping both side lengths along the scaled w
    side went down to 0.15, mmrotate's formula to 0.002)."""
    g = torch.Generator().manual_seed(11)
    boxes = random_rboxes(300, seed=11)
    scales = 0.3 + torch.rand(300, 2, generator=g, dtype=torch.float64) * 2.7
    for box, (sx, sy) in zip(boxes, scales.tolist()):
        scaled = rescale_rboxes(box[None], sx, sy)
        exact = Polygon(corners(box[None])[0].numpy() * [sx, sy])
        fitted = Polygon(corners(scaled)[0].numpy())
        assert fitted.area == pytest.approx(exact.area, rel=1e-9)
        assert exact.intersection(fitted).area / exact.union(fitted).area >= 0.6


def test_rescale_is_le90_and_shared_by_rotated_boxes():
    boxes = random_rboxes(200, seed=12)
    scaled = rescale_rboxes(boxes, 0.4, 2.5)
    assert (scaled[:, 2] >= scaled[:, 3]).all()
    assert (scaled[:, 4] >= -math.pi / 2).all() and (scaled[:, 4] < math.pi / 2).all()
    as_boxes = RotatedBoxes(boxes.clone())
    as_boxes.rescale_((0.4, 2.5))
    assert torch.equal(as_boxes.tensor, scaled)
    # equal scales: the same rectangles, scaled
    assert_same_rectangles(rescale_rboxes(boxes, 3.0, 3.0),
                           qbox2rbox(corners(boxes).reshape(-1, 8) * 3), atol=1e-4)
    for bad in (0.0, -1.0, float('nan'), float('inf')):
        with pytest.raises(ValueError, match='scale_y must be a positive finite number'):
            rescale_rboxes(boxes, 1.0, bad)
    assert rescale_rboxes(torch.zeros(2, 5), 2.0, 3.0).eq(0).all()  # degenerate: no NaN


def test_hbox_as_prior_keeps_width_and_height():
    prior = hbox_as_prior(torch.tensor([[0.0, 0.0, 4.0, 10.0]]))
    assert prior.tolist() == [[2.0, 5.0, 4.0, 10.0, 0.0]]
    assert hbox2rbox(torch.tensor([[0.0, 0.0, 4.0, 10.0]]))[0, 2] == 10.0  # le90 swaps; the prior does not
    with pytest.raises(ValueError, match=r'hbox_as_prior\(hboxes\): expected a tensor of shape'):
        hbox_as_prior(torch.zeros(3, 5))


def test_translate_and_clip():
    boxes = RotatedBoxes(torch.tensor([[10.0, 20.0, 8.0, 4.0, 0.3]]))
    boxes.translate_((5.0, -5.0))
    assert boxes.tensor[0, :2].tolist() == [15.0, 15.0]
    before = boxes.tensor.clone()
    with pytest.warns(UserWarning, match='clip_object_border=False'):
        boxes.clip_((10, 10))
    assert torch.equal(boxes.tensor, before)


def test_is_inside_and_find_inside_points():
    boxes = RotatedBoxes(torch.tensor([[5.0, 5.0, 4.0, 2.0, 0.0], [50.0, 5.0, 4.0, 2.0, 0.0],
                                       [9.0, 5.0, 4.0, 2.0, 0.0]]))
    assert boxes.is_inside((10, 20)).tolist() == [True, False, True]
    assert boxes.is_inside((10, 10), all_inside=True).tolist() == [True, False, False]
    rotated = RotatedBoxes(torch.tensor([[0.0, 0.0, 10.0, 2.0, math.pi / 4]]))
    points = torch.tensor([[0.0, 0.0], [3.0, 3.0], [3.0, -3.0], [4.0, 0.0]])
    assert rotated.find_inside_points(points)[:, 0].tolist() == [True, True, False, False]
    assert rotated.find_inside_points(points[:1], is_aligned=True).tolist() == [True]


def test_overlaps_match_shapely():
    a, b = random_rboxes(15, seed=8).float(), random_rboxes(12, seed=9).float()
    b[:6, :2] = a[:6, :2] + 3  # some real overlaps
    ious = RotatedBoxes.overlaps(RotatedBoxes(a), RotatedBoxes(b))
    pa, pb = [Polygon(c) for c in corners(a).numpy()], [Polygon(c) for c in corners(b).numpy()]
    expected = torch.tensor([[p.intersection(q).area / p.union(q).area for q in pb] for p in pa])
    assert (expected > 0.05).sum() >= 5
    assert torch.allclose(ious, expected.float(), atol=1e-4)
    iof = RotatedBoxes.overlaps(RotatedBoxes(a), RotatedBoxes(b), mode='iof')
    expected_iof = torch.tensor([[p.intersection(q).area / p.area for q in pb] for p in pa])
    assert torch.allclose(iof, expected_iof.float(), atol=1e-4)
    assert RotatedBoxes.overlaps(RotatedBoxes(a[:0]), RotatedBoxes(b)).shape == (0, 12)


def test_from_instance_masks():
    rbox = torch.tensor([[30.0, 25.0, 30.0, 10.0, 0.5]])
    quad = corners(rbox)[0].numpy()
    from_polygons = RotatedBoxes.from_instance_masks(PolygonMasks([[quad.reshape(-1)]], 50, 60))
    assert_same_rectangles(from_polygons.tensor, rbox, atol=1e-3)
    mask = np.zeros((50, 60), np.uint8)
    cv2.fillPoly(mask, [np.round(quad).astype(np.int32)], 1)
    from_bitmap = RotatedBoxes.from_instance_masks(BitmapMasks(mask[None], 50, 60))
    assert torch.allclose(from_bitmap.tensor[0, :4], rbox[0, :4], atol=2.0)  # rasterization
    with pytest.raises(TypeError, match='BitmapMasks or PolygonMasks'):
        RotatedBoxes.from_instance_masks(mask)


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match=r'rbox2qbox\(boxes\).*\(\.\.\., 5\)'):
        rbox2qbox(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r'qbox2rbox\(qboxes\).*\(\.\.\., 8\)'):
        qbox2rbox(torch.zeros(3, 5))
    with pytest.raises(ValueError, match='non-finite'):
        qbox2rbox(torch.full((1, 8), float('nan')))
    with pytest.raises(AssertionError, match='must be 5'):
        RotatedBoxes(torch.zeros(3, 4))
