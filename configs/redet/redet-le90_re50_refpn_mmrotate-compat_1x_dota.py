# mmrotate's ReDet (redet-le90_re50_refpn_1x_dota.py) as it computes: RoIAlign in stage 1 and, in
# stage 2, RiRoIAlignRotated with mmcv's orientation interpolation (legacy_orientation=True), which
# mmrotate's and the original ReDet's checkpoints were trained with. Their checkpoints load here as
# saved (load_from, tools/test.py CONFIG CKPT) and give mmrotate's detections
# (tests/test_interop/test_mmrotate_checkpoints.py). For training from scratch prefer the
# continuous interpolation of redet-le90_re50_refpn_roialign_1x_dota.py.
_base_ = ['./redet-le90_re50_refpn_roialign_1x_dota.py']

# A list in a child config replaces the base's list whole: stage 1 is the base's, stage 2 the
# base's with one flag added to its RoI layer.
model = dict(roi_head=dict(bbox_roi_extractor=[
    _base_.model.roi_head.bbox_roi_extractor[0],
    dict(_base_.model.roi_head.bbox_roi_extractor[1],
         roi_layer=dict(_base_.model.roi_head.bbox_roi_extractor[1].roi_layer,
                        legacy_orientation=True)),
]))

# mmrotate's rule for difficult objects (its DOTADataset's diff_thr=100): ground truth like any
# other object, in training and in evaluation, so the same checkpoint on the same data gives
# mmrotate's mAP. The other configs keep DOTA devkit's rule (ignored).
train_dataloader = dict(dataset=dict(ignore_difficult=False))
val_dataloader = dict(dataset=dict(ignore_difficult=False))
test_dataloader = dict(dataset=dict(ignore_difficult=False))
