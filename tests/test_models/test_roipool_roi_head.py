"""RoIPoolRoIHead as the second stage of mmdet's Faster R-CNN: one training step and a prediction
on tiny inputs, on the CPU."""
from pathlib import Path

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.ops import RoIPool

CONFIG = (Path(__file__).resolve().parents[2]
          / "configs/faster_rcnn_roipool/faster-rcnn_r18_fpn_roipool_tiny-coco.py")


@pytest.fixture(scope="module")
def detector():
    cfg = Config.fromfile(str(CONFIG))
    cfg.model.roi_head = dict(type="RedetRoIPoolRoIHead", num_classes=2, in_channels=64,
                              fc_out_channels=32)
    init_default_scope("mmdet")
    torch.manual_seed(0)
    return MODELS.build(cfg.model)


def test_faster_rcnn_with_roipool_head_trains_and_predicts(detector):
    head = detector.roi_head
    assert all(type(layer) is RoIPool for layer in head.bbox_roi_extractor.roi_layers)
    assert head.train_cfg is not None and head.test_cfg is not None  # the detector passed them on
    detector.train()
    data = detector.data_preprocessor(
        demo_mm_inputs(batch_size=2, image_shapes=(3, 96, 128), num_items=[3, 2], num_classes=2),
        True)
    losses = detector(**data, mode="loss")
    assert {"loss_cls", "loss_bbox", "loss_rpn_cls"} <= set(losses)
    total, _ = detector.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    fc = head.bbox_head.shared_fcs[0].weight
    assert fc.grad is not None and fc.grad.abs().sum() > 0
    assert detector.neck.fpn_convs[0].conv.weight.grad.abs().sum() > 0  # through our RoIPool

    detector.eval()
    with torch.no_grad():
        [result] = detector(**detector.data_preprocessor(
            demo_mm_inputs(batch_size=1, image_shapes=(3, 96, 128), num_classes=2), False),
            mode="predict")
    boxes = result.pred_instances.bboxes
    assert boxes.dim() == 2 and boxes.size(1) == 4
    assert result.pred_instances.labels.lt(2).all()


def test_pooled_size_and_bbox_head_input_must_agree():
    init_default_scope("mmdet")
    with pytest.raises(ValueError, match=r"pools to \(5, 5\) but bbox_head expects roi_feat_size "
                                         r"\(7, 7\)"):
        MODELS.build(dict(type="RedetRoIPoolRoIHead", num_classes=2,
                          bbox_roi_extractor=dict(roi_layer=dict(output_size=5))))
    head = MODELS.build(dict(type="RedetRoIPoolRoIHead", num_classes=2, roi_size=5))
    assert head.bbox_roi_extractor.roi_layers[0].output_size == (5, 5)
    assert tuple(head.bbox_head.roi_feat_size) == (5, 5)


def test_an_override_with_another_type_replaces_the_preset():
    init_default_scope("mmdet")
    with pytest.warns(UserWarning, match=r"pools with mmcv\.ops\.roi_align\.RoIAlign, not "
                                         r"redet_plugin's RoIPool"):
        head = MODELS.build(dict(
            type="RedetRoIPoolRoIHead", num_classes=2,
            bbox_roi_extractor=dict(roi_layer=dict(type="RoIAlign", output_size=7,
                                                   sampling_ratio=0))))
    layer = head.bbox_roi_extractor.roi_layers[0]
    assert type(layer).__module__.startswith("mmcv.ops") and type(layer).__name__ == "RoIAlign"


def test_explicit_arguments_that_the_dicts_contradict_are_an_error():
    init_default_scope("mmdet")
    with pytest.raises(ValueError, match=r"num_classes=3 but bbox_head\.num_classes=5; "
                                         r"in_channels=64 but bbox_roi_extractor\.out_channels=128"):
        MODELS.build(dict(type="RedetRoIPoolRoIHead", num_classes=3, in_channels=64,
                          bbox_head=dict(num_classes=5),
                          bbox_roi_extractor=dict(out_channels=128)))
    with pytest.raises(ValueError, match=r"roi_size=5 but bbox_roi_extractor\.roi_layer\."
                                         r"output_size=7"):
        MODELS.build(dict(type="RedetRoIPoolRoIHead", roi_size=5,
                          bbox_roi_extractor=dict(roi_layer=dict(output_size=7))))
    # the same value in both places, or a value set in one place only, is fine
    head = MODELS.build(dict(type="RedetRoIPoolRoIHead", num_classes=3, roi_size=5,
                             bbox_head=dict(num_classes=3, roi_feat_size=(5, 5))))
    assert head.bbox_head.num_classes == 3
    assert MODELS.build(dict(type="RedetRoIPoolRoIHead", bbox_head=dict(num_classes=4))
                        ).bbox_head.num_classes == 4
