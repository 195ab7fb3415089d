"""nms_keep_mask on CUDA: the same keep mask as the CPU kernel (which
test_nms_keep_mask.py checks against mmcv and a float64 reference), no host synchronisation, and
capture in a CUDA graph.

What the CUDA path adds, and which test covers it:
- the 64-wide suppression words and the skipped words between label groups
  (test_cuda_matches_cpu with labels: groups longer than, shorter than and across 64-box blocks);
- the greedy scan: label groups side by side, one block for the groups starting in each 64-box
  tile (test_cuda_label_groups_of_every_size: groups across tiles, several starting in one tile,
  one box per label), the diagonal word resolved by shuffles, the later tiles ORed in shared
  memory (N = 63, 64, 65, 129 and thousands; all boxes identical: one kept; all apart: all kept);
- no sync: torch.cuda.set_sync_debug_mode('error') raises on any synchronising call;
- fixed shapes: a graph captured once replays on new boxes and gives their eager result.
"""
import pytest
import torch

from redet_plugin.ops import nms_keep_mask
from redet_plugin.testing import waits_for_nothing
from tests._helpers import random_horizontal_boxes, random_rotated_boxes, safe_iou_threshold

pytestmark = pytest.mark.cuda


def inputs(n, box_dim=5, num_classes=0, seed=0, dtype=torch.float32, spread=None):
    g = torch.Generator().manual_seed(seed)
    if box_dim == 5:
        boxes, scores = random_rotated_boxes(n, g, spread=spread or max(200.0, n / 5.0))
    else:
        boxes, scores = random_horizontal_boxes(n, g)
    labels = torch.randint(0, num_classes, (n,), generator=g) if num_classes else None
    return boxes.to(dtype), scores.to(dtype), labels


def on_cuda(*tensors):
    return [t.cuda() if t is not None else None for t in tensors]


def assert_cuda_equals_cpu(boxes, scores, near_threshold, labels):
    """Equal keep masks at a threshold near `near_threshold` that no pair's IoU is within 1e-5 of
    (tests/_helpers.py, safe_iou_threshold, says why)."""
    iou_threshold = safe_iou_threshold(boxes.cuda(), labels, near_threshold)
    expected = nms_keep_mask(boxes, scores, iou_threshold, labels)
    got = nms_keep_mask(*on_cuda(boxes, scores), iou_threshold,
                        labels.cuda() if labels is not None else None)
    assert got.device.type == "cuda" and got.dtype == torch.bool and got.shape == expected.shape
    differ = (got.cpu() != expected).nonzero().flatten().tolist()
    assert not differ, f"CUDA and CPU disagree on boxes {differ[:10]} of {len(expected)}"


@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 129, 1000, 3000])
@pytest.mark.parametrize("box_dim", [5, 4])
@pytest.mark.parametrize("num_classes", [0, 1, 15])
def test_cuda_matches_cpu(n, box_dim, num_classes):
    boxes, scores, labels = inputs(n, box_dim, num_classes, seed=n)
    for near_threshold in (0.1, 0.5):
        assert_cuda_equals_cpu(boxes, scores, near_threshold, labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cuda_matches_cpu_in_every_dtype(dtype):
    boxes, scores, labels = inputs(700, 5, 4, seed=1, dtype=dtype)
    assert_cuda_equals_cpu(boxes, scores, 0.3, labels)


@pytest.mark.parametrize("labels_kind", ["few large groups", "many groups under 64 boxes",
                                         "one box per label", "labels sorted by score",
                                         "image x level groups like the rpn's",
                                         "groups among single boxes like the rcnn's"])
def test_cuda_label_groups_of_every_size(labels_kind):
    # The mask kernel skips the words between label groups and the scan stops at a group's end:
    # groups that span several 64-box blocks, end inside one, or hold a single box.
    n = 2000
    boxes, scores, _ = inputs(n, 5, seed=2, spread=150.0)
    if labels_kind == "few large groups":
        labels = torch.randint(0, 3, (n,))
    elif labels_kind == "many groups under 64 boxes":
        labels = torch.randint(0, 300, (n,))
    elif labels_kind == "one box per label":
        labels = torch.randperm(n)
    elif labels_kind == "labels sorted by score":
        labels = (scores.argsort(descending=True).argsort() // 37).long()
    elif labels_kind == "groups among single boxes like the rcnn's":
        # (multiclass NMS: every pair below score_thr has a label of its own)
        labels = torch.where(torch.rand(n) < 0.3, torch.randint(0, 4, (n,)), torch.arange(n) + 4)
    else:  # groups of hundreds, none aligned to a tile, of the labels in any order
        sizes = torch.tensor([700, 500, 300, 97, 3, 400])
        labels = torch.tensor([4, 0, 5, 2, 1, 3]).repeat_interleave(sizes)
    assert_cuda_equals_cpu(boxes, scores, 0.2, labels)
    if labels_kind == "one box per label":
        assert nms_keep_mask(*on_cuda(boxes, scores), 0.2, labels.cuda()).all()


def test_cuda_large_n_with_classes_like_the_rcnn_test():
    # 2000 RoIs x 15 classes: the size the rotated bbox head suppresses at test time
    boxes, scores, labels = inputs(30000, 5, 15, seed=3, spread=1000.0)
    assert_cuda_equals_cpu(boxes, scores, 0.1, labels)


def test_cuda_all_identical_keeps_one_all_apart_keeps_all():
    n = 1000
    same = torch.tensor([[100.0, 100.0, 30.0, 10.0, 0.2]]).repeat(n, 1)
    scores = torch.rand(n)
    keep = nms_keep_mask(*on_cuda(same, scores), 0.5)
    assert keep.sum().item() == 1 and keep[scores.argmax()].item()
    apart = torch.stack([torch.arange(n) * 50.0, torch.zeros(n), torch.full((n,), 20.0),
                         torch.full((n,), 10.0), torch.zeros(n)], 1)
    assert nms_keep_mask(*on_cuda(apart, scores), 0.0).all()


def test_cuda_ties_duplicates_and_nan_follow_the_cpu_rule():
    g = torch.Generator().manual_seed(4)
    boxes, _, _ = inputs(100, 5, seed=4, spread=60.0)
    boxes = torch.cat([boxes, boxes[:50]])
    scores = torch.randint(0, 4, (150,), generator=g).float()
    scores[::17] = float("nan")
    boxes[5, 2] = float("nan")
    labels = torch.randint(0, 2, (150,), generator=g)
    assert_cuda_equals_cpu(boxes, scores, 0.3, labels)
    assert_cuda_equals_cpu(boxes, scores, 0.3, None)


def test_cuda_non_contiguous_inputs():
    boxes, scores, labels = inputs(300, 5, 3, seed=5)
    wide = torch.zeros(300, 8, device="cuda")
    wide[:, 1:6] = boxes.cuda()
    threshold = safe_iou_threshold(boxes, labels, 0.4)
    got = nms_keep_mask(wide[:, 1:6], torch.stack([scores, scores], 1).cuda()[:, 1], threshold,
                        labels.cuda().view(-1, 1).expand(300, 2)[:, 1])
    assert torch.equal(got.cpu(), nms_keep_mask(boxes, scores, threshold, labels))


@pytest.mark.parametrize("box_dim", [5, 4])
def test_cuda_no_host_synchronisation(box_dim):
    boxes, scores, labels = on_cuda(*inputs(3000, box_dim, 15, seed=6))
    with_labels = safe_iou_threshold(boxes, labels, 0.5)
    without = safe_iou_threshold(boxes, None, 0.5)
    nms_keep_mask(boxes, scores, with_labels, labels)  # warm-up: first-call allocations, init
    with waits_for_nothing():
        keep = nms_keep_mask(boxes, scores, with_labels, labels)
        no_labels = nms_keep_mask(boxes, scores, without)
    cpu = [boxes.cpu(), scores.cpu()]
    assert torch.equal(keep.cpu(), nms_keep_mask(*cpu, with_labels, labels.cpu()))
    assert torch.equal(no_labels.cpu(), nms_keep_mask(*cpu, without))


def test_cuda_graph_capture_replays_with_new_inputs():
    n = 1500
    first = on_cuda(*inputs(n, 5, 15, seed=7))
    static = [t.clone() for t in first]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph, as torch.cuda.graph asks
        nms_keep_mask(static[0], static[1], 0.3, static[2])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_keep = nms_keep_mask(static[0], static[1], 0.3, static[2])
    for seed in (8, 9):
        new = on_cuda(*inputs(n, 5, 15, seed=seed))
        for dst, src in zip(static, new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_keep, nms_keep_mask(*new[:2], 0.3, new[2]))


def test_cuda_errors_are_named():
    boxes, scores, labels = on_cuda(*inputs(10, 5, 2))
    with pytest.raises(RuntimeError, match="nms_keep_mask: scores must be on the device of boxes"):
        torch.ops.redet.nms_keep_mask(boxes, scores.cpu(), 0.5, labels)
    with pytest.raises(RuntimeError, match="nms_keep_mask: labels must be on the device of boxes"):
        torch.ops.redet.nms_keep_mask(boxes, scores, 0.5, labels.cpu())
    too_many = 6000 * 64 + 1
    with pytest.raises(RuntimeError, match="nms_keep_mask: at most 384000 boxes on CUDA"):
        nms_keep_mask(torch.zeros(too_many, 5, device="cuda"),
                      torch.zeros(too_many, device="cuda"), 0.5)
