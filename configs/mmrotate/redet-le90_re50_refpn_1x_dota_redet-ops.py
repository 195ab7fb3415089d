# mmrotate-dev 1.0.1's ReDet (redet/redet-le90_re50_refpn_1x_dota.py, taken from the installed
# mmrotate package) with one change: the second stage pools its rotated RoIs with redet_plugin's
# extractor and RiRoIAlignRotated (one kernel launch for all FPN levels instead of mmrotate's
# per-level loop). Use it with mmrotate's own tools, e.g.
#   python <mmrotate>/.mim/tools/train.py configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py
# Stage 1 keeps mmcv's RoIAlign (we have no RoIAlign of our own); the rest is mmrotate's config.
_base_ = 'mmrotate::redet/redet-le90_re50_refpn_1x_dota.py'
custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)

# A list in a child config replaces the base's list whole: stage 1 is mmrotate's (`_base_.x`
# reads the base config's value), stage 2 mmrotate's with our extractor and RoI layer.
model = dict(roi_head=dict(bbox_roi_extractor=[
    _base_.model.roi_head.bbox_roi_extractor[0],
    dict(
        _base_.model.roi_head.bbox_roi_extractor[1],
        type='mmdet.RedetRotatedSingleRoIExtractor',
        roi_layer=dict(
            type='RedetRiRoIAlignRotated',
            output_size=7,
            num_samples=2,
            num_orientations=8,
            clockwise=True,
            # True: the same features as mmcv's kernel, so mmrotate's checkpoints give their
            # published results. False: orientation interpolation continuous in theta (the
            # corrected kernel) for models trained with it.
            legacy_orientation=True)),
]))
