# The ReDet R50 model with RoIAlign in the first (horizontal) RoI stage, as mmrotate's configs
# have it; everything else as redet-le90_re50_refpn.py.
_base_ = ['./redet-le90_re50_refpn.py']

# A list in a child config replaces the base's list whole, so each stage's extractor is the
# base's (`_base_.x` reads the base config's value) with only what differs stated.
model = dict(roi_head=dict(bbox_roi_extractor=[
    dict(_base_.model.roi_head.bbox_roi_extractor[0],
         roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0)),
    _base_.model.roi_head.bbox_roi_extractor[1],
]))
