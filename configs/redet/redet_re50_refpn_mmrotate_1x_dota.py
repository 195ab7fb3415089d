# mmrotate's ReDet (redet-le90_re50_refpn_1x_dota.py) as it computes: RoIAlign in stage 1 and, in
# stage 2, RiRoIAlignRotated with mmcv's orientation interpolation (legacy_orientation=True), which
# mmrotate's and the original ReDet's checkpoints were trained with. Their checkpoints load here as
# saved (load_from, tools/test.py CONFIG CKPT) and give mmrotate's detections
# (tests/test_interop/test_mmrotate_checkpoints.py). For training from scratch prefer the
# continuous interpolation of redet_re50_refpn_roialign_1x_dota.py.
_base_ = ['./redet_re50_refpn_roialign_1x_dota.py']
custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)

model = dict(
    roi_head=dict(bbox_roi_extractor=[
        dict(
            type='RedetHorizontalSingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32]),
        dict(
            type='RedetRotatedSingleRoIExtractor',
            roi_layer=dict(type='RedetRiRoIAlignRotated', output_size=7, num_samples=2,
                           num_orientations=8, clockwise=True, legacy_orientation=True),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32]),
    ]))

# mmrotate's rule for difficult objects (its DOTADataset's diff_thr=100): ground truth like any
# other object, in training and in evaluation, so the same checkpoint on the same data gives
# mmrotate's mAP. The other configs keep DOTA devkit's rule (ignored).
train_dataloader = dict(dataset=dict(ignore_difficult=False))
val_dataloader = dict(dataset=dict(ignore_difficult=False))
test_dataloader = dict(dataset=dict(ignore_difficult=False))
