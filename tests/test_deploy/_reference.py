"""The model's own test forward on one image (what tools/test.py and RotatedDetector run), and
the comparison of detections that the deploy tests share."""
import numpy as np
import torch


def reference_model(config, checkpoint, plain=False):
    """The detector as RotatedDetector builds it (eval, CPU); plain: after convert_to_plain."""
    from redet_plugin.inference.detector import _build_model
    from redet_plugin.models.layers.equivariant import convert_to_plain
    model = _build_model(config, checkpoint, torch.device('cpu'), None)[0]
    return convert_to_plain(model) if plain else model


def model_detections(model, image: np.ndarray):
    """(boxes (K, 5), scores (K,), labels (K,)) of the model's test_step on one BGR image."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import get_box_tensor
    height, width = image.shape[:2]
    sample = DetDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                         scale_factor=(1.0, 1.0)))
    with torch.no_grad():
        output = model.test_step(dict(inputs=[torch.from_numpy(image.transpose(2, 0, 1).copy())],
                                      data_samples=[sample]))[0]
    pred = output.pred_instances
    return get_box_tensor(pred.bboxes).float(), pred.scores.float(), pred.labels.long()


def _assert_same_count(scores, ref_scores):
    assert len(ref_scores) > 0, 'the reference has no detections: the comparison would be empty'
    assert len(scores) == len(ref_scores), (len(scores), len(ref_scores))


def assert_same_detections(ours, ref):
    """Same count (> 0) and labels, scores within 1e-3, boxes within 1e-3 relative."""
    boxes, scores, labels = ours
    ref_boxes, ref_scores, ref_labels = ref
    _assert_same_count(scores, ref_scores)
    assert torch.equal(labels, ref_labels)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=1e-3)
    torch.testing.assert_close(boxes, ref_boxes, rtol=1e-3, atol=1e-3)


def assert_matching_detections(ours, ref, tolerance, min_share=1.0):
    """Same count (> 0); at least `min_share` of the reference detections each have their own
    of ours with the same label, the score within `tolerance` and the box within it relative, in
    any order (half precision reorders near-equal scores)."""
    boxes, scores, labels = ours
    ref_boxes, ref_scores, ref_labels = ref
    _assert_same_count(scores, ref_scores)
    free = torch.ones(len(scores), dtype=torch.bool)
    unmatched = []
    for box, score, label in zip(ref_boxes, ref_scores, ref_labels):
        box_error = ((boxes - box).abs() / (box.abs() + 1)).amax(dim=1)
        fits = free & (labels == label) & (box_error <= tolerance) & \
            ((scores - score).abs() <= tolerance)
        if fits.any():
            free[torch.nonzero(fits)[0, 0]] = False
        else:
            unmatched.append(f'{label.item()} {score.item():.4f} {box.tolist()}')
    assert len(unmatched) <= (1 - min_share) * len(ref_scores), \
        f'{len(unmatched)} of {len(ref_scores)} unmatched, e.g. {unmatched[:3]}'
