"""nms_keep_mask (greedy NMS, fixed-size keep mask) against mmcv's nms / nms_rotated and against a
plain greedy loop over shapely's float64 IoU (tests/test_ops/_reference.py). CUDA tests:
test_nms_keep_mask_cuda.py."""
import math

import pytest
import torch

from redet_plugin.ops import nms_keep_mask
from tests._helpers import random_horizontal_boxes, random_rotated_boxes
from tests.test_ops._reference import (greedy_nms_reference, horizontal_iou_reference,
                                       rotated_iou_reference)

mmcv_ops = pytest.importorskip("mmcv.ops")


def mmcv_keep(boxes, scores, iou_threshold, labels=None):
    """mmcv's keep set as a mask; class-wise by running mmcv per label (mmcv ignores labels)."""
    keep = torch.zeros(boxes.shape[0], dtype=torch.bool)
    groups = [torch.arange(boxes.shape[0])] if labels is None else [
        (labels == c).nonzero().flatten() for c in labels.unique()]
    for index in groups:
        if index.numel() == 0:
            continue
        if boxes.shape[1] == 5:
            _, kept = mmcv_ops.nms_rotated(boxes[index], scores[index], iou_threshold)
        else:
            _, kept = mmcv_ops.nms(boxes[index], scores[index], iou_threshold)
        keep[index[kept]] = True
    return keep


def op_iou_brackets(a, b, iou, margin):
    """Whether the op's IoU of (a, b) lies within iou +- margin: b (lower score) survives at
    threshold iou + margin and is suppressed at iou - margin (suppression needs IoU > threshold)."""
    boxes = torch.stack([a, b])
    scores = torch.tensor([1.0, 0.5], dtype=boxes.dtype)
    kept_above = nms_keep_mask(boxes, scores, iou + margin)[1].item()
    kept_below = nms_keep_mask(boxes, scores, iou - margin)[1].item()
    return kept_above and not kept_below


# --- the IoU --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, margin", [(torch.float64, 1e-9), (torch.float32, 2e-5)])
def test_rotated_iou_matches_shapely(dtype, margin):
    g = torch.Generator().manual_seed(0)
    boxes, _ = random_rotated_boxes(400, g, dtype, spread=40, clusters=8)
    checked = 0
    for k in range(0, 400, 2):
        a, b = boxes[k], boxes[k + 1]
        iou = rotated_iou_reference(a.double(), b.double())
        if iou == 0:  # disjoint: kept at threshold 0 (0 > 0 is false), suppressed just below
            assert op_iou_brackets(a, b, 0.0, margin), (a, b)
            continue
        checked += 1
        assert op_iou_brackets(a, b, iou, margin), (a.tolist(), b.tolist(), iou)
    assert checked > 50


def test_rotated_iou_agrees_with_mmcv_on_generic_boxes():
    g = torch.Generator().manual_seed(1)
    boxes, _ = random_rotated_boxes(300, g, spread=40, clusters=6)
    a, b = boxes[0::2], boxes[1::2]
    theirs = mmcv_ops.box_iou_rotated(a, b, aligned=True)
    for k in range(a.shape[0]):
        assert op_iou_brackets(a[k], b[k], theirs[k].item(), 1e-4), (a[k], b[k], theirs[k])


def contained_sharing_three_edges(generator, count):
    """Pairs (outer, inner): inner has outer's h and theta, a shorter w, and sits at one end, so
    three of its edges lie on outer's edges."""
    pairs = []
    for _ in range(count):
        theta = [0.0, math.pi / 2, -math.pi / 2, math.pi / 4,
                 (torch.rand(1, generator=generator).item() - 0.5) * math.pi][
            torch.randint(0, 5, (1,), generator=generator).item()]
        big_w, h = (torch.randint(2, 41, (2,), generator=generator)).tolist()
        w = torch.randint(1, big_w, (1,), generator=generator).item()
        cx, cy = (torch.rand(2, generator=generator) * 800).tolist()
        shift = (big_w - w) / 2 * (1 if torch.rand(1, generator=generator).item() < 0.5 else -1)
        c, s = math.cos(theta), math.sin(theta)
        pairs.append(([cx, cy, big_w, h, theta], [cx + shift * c, cy + shift * s, w, h, theta]))
    outer, inner = zip(*pairs)
    return torch.tensor(outer), torch.tensor(inner)


def test_box_inside_another_sharing_three_edges_matches_shapely():
    # One such pair: mmcv 2.1's box_iou_rotated gives 0 here, shapely (and the op) 0.5833.
    outer = torch.tensor([645.0, 312.0, 24.0, 26.0, math.pi / 4])
    inner = torch.tensor([641.4644775390625, 308.4644775390625, 14.0, 26.0, math.pi / 4])
    iou = rotated_iou_reference(outer.double(), inner.double())
    assert iou == pytest.approx(14 / 24, abs=1e-6)
    assert op_iou_brackets(outer, inner, iou, 2e-5)
    assert op_iou_brackets(inner, outer, iou, 2e-5)
    outer, inner = contained_sharing_three_edges(torch.Generator().manual_seed(2), 300)
    for a, b in zip(outer, inner):
        iou = rotated_iou_reference(a.double(), b.double())
        assert op_iou_brackets(a, b, iou, 2e-5), (a.tolist(), b.tolist(), iou)
        assert op_iou_brackets(a.double(), b.double(), iou, 1e-9), (a.tolist(), b.tolist(), iou)


def test_horizontal_iou_is_mmcvs_with_offset_0():
    a = torch.tensor([0.0, 0.0, 4.0, 1.0])
    b = torch.tensor([0.0, 0.0, 2.0, 1.0])  # IoU exactly 0.5
    assert horizontal_iou_reference(a, b) == 0.5
    assert op_iou_brackets(a, b, 0.5, 1e-6)
    keep = nms_keep_mask(torch.stack([a, b]), torch.tensor([1.0, 0.5]), 0.5)
    assert keep.tolist() == [True, True]  # suppression needs IoU > threshold (strict)
    # touching boxes: mmcv's offset 0 gives IoU 0 (offset 1 would count the shared pixel line)
    c = torch.tensor([4.0, 0.0, 6.0, 1.0])
    keep = nms_keep_mask(torch.stack([a, c]), torch.tensor([1.0, 0.5]), 0.0)
    assert keep.tolist() == [True, True]


def test_degenerate_and_non_finite_boxes_have_iou_0():
    box = [10.0, 10.0, 8.0, 4.0, 0.3]
    boxes = torch.tensor([box, [10.0, 10.0, 0.0, 4.0, 0.3], [10.0, 10.0, 8.0, float("nan"), 0.3],
                          [float("inf"), 10.0, 8.0, 4.0, 0.3], box])
    scores = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    # IoU 0 with everything: kept at threshold 0; only the duplicate of box 0 is suppressed
    assert nms_keep_mask(boxes, scores, 0.0).tolist() == [True, True, True, True, False]
    # ... and suppressed by anything at a negative threshold (0 > -0.5)
    assert nms_keep_mask(boxes, scores, -0.5).tolist() == [True, False, False, False, False]


# --- greedy NMS against mmcv -------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 17, 200, 1000])
@pytest.mark.parametrize("iou_threshold", [0.1, 0.5, 0.8])
def test_rotated_keep_set_equals_mmcv_nms_rotated(n, iou_threshold):
    boxes, scores = random_rotated_boxes(n, torch.Generator().manual_seed(n))
    keep = nms_keep_mask(boxes, scores, iou_threshold)
    assert keep.shape == (n,) and keep.dtype == torch.bool
    assert torch.equal(keep, mmcv_keep(boxes, scores, iou_threshold))


@pytest.mark.parametrize("n", [1, 17, 200, 1000])
@pytest.mark.parametrize("iou_threshold", [0.3, 0.7])
def test_horizontal_keep_set_equals_mmcv_nms(n, iou_threshold):
    boxes, scores = random_horizontal_boxes(n, torch.Generator().manual_seed(n))
    keep = nms_keep_mask(boxes, scores, iou_threshold)
    assert torch.equal(keep, mmcv_keep(boxes, scores, iou_threshold))


@pytest.mark.parametrize("box_dim", [5, 4])
@pytest.mark.parametrize("num_classes", [1, 3, 15])
def test_labels_keep_set_equals_mmcv_run_per_class(box_dim, num_classes):
    g = torch.Generator().manual_seed(num_classes)
    make = random_rotated_boxes if box_dim == 5 else random_horizontal_boxes
    boxes, scores = make(600, g)
    labels = torch.randint(0, num_classes, (600,), generator=g)
    keep = nms_keep_mask(boxes, scores, 0.3, labels)
    assert torch.equal(keep, mmcv_keep(boxes, scores, 0.3, labels))
    # different labels never suppress: the same boxes without labels lose more
    if num_classes > 1:
        assert nms_keep_mask(boxes, scores, 0.3).sum() < keep.sum()


def test_large_n_equals_mmcv():
    boxes, scores = random_rotated_boxes(3000, torch.Generator().manual_seed(3), spread=600)
    keep = nms_keep_mask(boxes, scores, 0.5)
    assert torch.equal(keep, mmcv_keep(boxes, scores, 0.5))


# --- greedy NMS against the float64 reference ----------------------------------------------------
@pytest.mark.parametrize("box_dim", [5, 4])
@pytest.mark.parametrize("with_labels", [False, True])
def test_matches_greedy_reference_over_float64_iou(box_dim, with_labels):
    g = torch.Generator().manual_seed(box_dim)
    make = random_rotated_boxes if box_dim == 5 else random_horizontal_boxes
    boxes, scores = make(150, g, torch.float64)
    labels = torch.randint(0, 3, (150,), generator=g) if with_labels else None
    for iou_threshold in (0.05, 0.4, 0.9):
        keep = nms_keep_mask(boxes, scores, iou_threshold, labels)
        assert torch.equal(keep, greedy_nms_reference(boxes, scores, iou_threshold, labels))


def test_ties_go_to_the_lower_index_and_duplicates_keep_one():
    box = [50.0, 50.0, 20.0, 10.0, 0.4]
    far, near = [200.0, 50.0, 20.0, 10.0, 0.0], [52.0, 50.0, 20.0, 10.0, 0.4]
    boxes = torch.tensor([box, far, box, box, near])
    scores = torch.tensor([0.5, 0.5, 0.9, 0.9, 0.9])
    keep = nms_keep_mask(boxes, scores, 0.5)
    # 2, 3, 4 tie at 0.9: 2 comes first and suppresses its duplicate 3, its neighbour 4 and 0
    assert keep.tolist() == [False, True, True, False, False]
    assert torch.equal(keep, greedy_nms_reference(boxes, scores, 0.5))
    # mmcv keeps the same boxes (its choice among exact duplicates may be another index)
    theirs = boxes[mmcv_keep(boxes, scores, 0.5)]
    assert torch.equal(boxes[keep].sort(0).values, theirs.sort(0).values)


def test_many_ties_and_duplicates_match_reference():
    g = torch.Generator().manual_seed(4)
    boxes, _ = random_rotated_boxes(60, g, torch.float64, spread=60, clusters=4)
    boxes = torch.cat([boxes, boxes[:30]])  # exact duplicates
    scores = torch.randint(0, 4, (90,), generator=g).double()  # many equal scores
    labels = torch.randint(0, 2, (90,), generator=g)
    for lab in (None, labels):
        assert torch.equal(nms_keep_mask(boxes, scores, 0.3, lab),
                           greedy_nms_reference(boxes, scores, 0.3, lab))


def test_nan_scores_are_visited_first():
    box = [50.0, 50.0, 20.0, 10.0, 0.4]
    boxes = torch.tensor([box, box])
    keep = nms_keep_mask(boxes, torch.tensor([0.9, float("nan")]), 0.5)
    assert keep.tolist() == [False, True]  # as torch's sort (and so mmcv) orders NaN


def test_empty_and_single_box():
    for dim in (5, 4):
        keep = nms_keep_mask(torch.zeros(0, dim), torch.zeros(0), 0.5,
                             torch.zeros(0, dtype=torch.long))
        assert keep.shape == (0,) and keep.dtype == torch.bool
        assert nms_keep_mask(torch.ones(1, dim), torch.ones(1), 0.5).tolist() == [True]


def test_threshold_1_keeps_everything_and_identical_boxes_have_iou_1():
    boxes = torch.tensor([[10.0, 10.0, 8.0, 4.0, 0.3]] * 3)
    scores = torch.tensor([3.0, 2.0, 1.0])
    assert nms_keep_mask(boxes, scores, 1.0).all()
    assert nms_keep_mask(boxes, scores, 0.999).tolist() == [True, False, False]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_inputs_compute_in_float32(dtype):
    boxes, scores = random_rotated_boxes(300, torch.Generator().manual_seed(5), dtype)
    labels = torch.randint(0, 3, (300,))
    keep = nms_keep_mask(boxes, scores, 0.4, labels)
    assert torch.equal(keep, nms_keep_mask(boxes.float(), scores.float(), 0.4, labels))


def test_non_contiguous_inputs():
    boxes, scores = random_rotated_boxes(100, torch.Generator().manual_seed(6))
    labels = torch.randint(0, 3, (100,))
    wide = torch.zeros(100, 9)
    wide[:, 2:7] = boxes
    keep = nms_keep_mask(wide[:, 2:7], torch.stack([scores, scores], 1)[:, 1],
                         0.4, torch.stack([labels, labels], 1)[:, 0])
    assert torch.equal(keep, nms_keep_mask(boxes, scores, 0.4, labels))


# --- the op's registration: opcheck, compile, meta ---------------------------------------------
@pytest.mark.parametrize("box_dim", [5, 4])
def test_opcheck(box_dim):
    make = random_rotated_boxes if box_dim == 5 else random_horizontal_boxes
    boxes, scores = make(40, torch.Generator().manual_seed(7))
    labels = torch.randint(0, 3, (40,))
    torch.library.opcheck(torch.ops.redet.nms_keep_mask.default, (boxes, scores, 0.4, labels))
    torch.library.opcheck(torch.ops.redet.nms_keep_mask.default, (boxes, scores, 0.4))
    torch.library.opcheck(torch.ops.redet.nms_keep_mask.default,
                          (boxes[:0], scores[:0], 0.4, labels[:0]))


def test_torch_compile_fullgraph():
    boxes, scores = random_rotated_boxes(80, torch.Generator().manual_seed(8))
    labels = torch.randint(0, 3, (80,))

    def keep_scores(b, s, lab):
        return torch.where(nms_keep_mask(b, s, 0.4, lab), s, torch.zeros_like(s))

    compiled = torch.compile(keep_scores, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(boxes, scores, labels), keep_scores(boxes, scores, labels))


def test_meta_tensors_give_the_shape_without_values():
    boxes = torch.empty(123, 5, device="meta")
    keep = nms_keep_mask(boxes, torch.empty(123, device="meta"), 0.5,
                         torch.empty(123, dtype=torch.long, device="meta"))
    assert keep.device.type == "meta" and keep.shape == (123,) and keep.dtype == torch.bool


# --- bad input -----------------------------------------------------------------------------------
GOOD = dict(boxes=torch.zeros(4, 5), scores=torch.zeros(4), iou_threshold=0.5,
            labels=torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("change, message", [
    (dict(boxes=torch.zeros(4, 6)), r"boxes must have shape \(N, 5\)"),
    (dict(boxes=torch.zeros(4)), r"boxes must have shape \(N, 5\)"),
    (dict(boxes=torch.zeros(4, 5, dtype=torch.long)), "boxes must be float16"),
    (dict(scores=torch.zeros(3)), r"scores must have shape \(N,\) = \(4,\)"),
    (dict(scores=torch.zeros(4, 1)), r"scores must have shape \(N,\)"),
    (dict(scores=torch.zeros(4, dtype=torch.float64)), "scores must have the dtype of boxes"),
    (dict(iou_threshold=float("nan")), "iou_threshold must be a finite number"),
    (dict(iou_threshold=float("inf")), "iou_threshold must be a finite number"),
    (dict(labels=torch.zeros(4, dtype=torch.int32)), "labels must be int64"),
    (dict(labels=torch.zeros(5, dtype=torch.long)), r"labels must have shape \(N,\) = \(4,\)"),
    (dict(labels=torch.zeros(4, 1, dtype=torch.long)), r"labels must have shape \(N,\)"),
])
def test_bad_input_is_named(change, message):
    args = {**GOOD, **change}
    with pytest.raises(RuntimeError, match=f"nms_keep_mask: {message}"):
        nms_keep_mask(**args)
    with pytest.raises(RuntimeError, match=f"nms_keep_mask: {message}"):  # the raw op too
        torch.ops.redet.nms_keep_mask(args["boxes"], args["scores"], args["iou_threshold"],
                                      args["labels"])


@pytest.mark.parametrize("change, error, message", [
    (dict(boxes=None), TypeError, "boxes must be a tensor"),
    (dict(scores=[0.0] * 4), TypeError, "scores must be a tensor"),
    (dict(labels=[0] * 4), TypeError, "labels must be a tensor"),
    (dict(iou_threshold="0.5x"), TypeError, "iou_threshold must be a number"),
    (dict(scores=torch.zeros(4, device="meta")), RuntimeError,
     "scores must be on the device of boxes"),
    (dict(labels=torch.zeros(4, dtype=torch.long, device="meta")), RuntimeError,
     "labels must be on the device of boxes"),
])
def test_bad_arguments_of_the_python_face(change, error, message):
    with pytest.raises(error, match=message):
        nms_keep_mask(**{**GOOD, **change})
