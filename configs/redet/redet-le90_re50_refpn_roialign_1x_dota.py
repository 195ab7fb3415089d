# The R50 ReDet with RoIAlign instead of RoIPool in the first (horizontal) RoI stage, as
# mmrotate's config does; everything else as redet-le90_re50_refpn_1x_dota.py.
_base_ = ['./redet-le90_re50_refpn_1x_dota.py']
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
                           num_orientations=8, clockwise=True),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32]),
    ]))
