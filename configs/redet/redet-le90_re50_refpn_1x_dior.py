# ReDet, ReResNet-50 + ReFPN, 1x schedule on DIOR-R (20 classes, 800 x 800 images, trained on
# train + val, tested on test). The DOTA-v1.0 model with RoIAlign in stage 1, as mmrotate;
# data_root: the data set as published, no preparation. Difficult objects are ground truth
# (mmrotate's rule; ignore_difficult=True for the devkit's).
_base_ = [
    '../_base_/models/redet-le90_re50_refpn_roialign.py',
    '../_base_/datasets/dior.py',
    '../_base_/schedules/schedule_1x.py',
    '../_base_/default_runtime.py',
]
model = dict(roi_head=dict(
    bbox_head=[dict(head, num_classes=20) for head in _base_.model.roi_head.bbox_head]))
