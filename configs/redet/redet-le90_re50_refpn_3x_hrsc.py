# ReDet, ReResNet-50 + ReFPN on HRSC2016 (one class, ship), 36 epochs, 800 x 512 images: ReDet's
# and mmrotate's HRSC setup (mmrotate's redet-le90_re50_refpn_3x_hrsc.py: RoIAlign in stage 1,
# lr 0.01). data_root: the data set as published (FullDataSet/, ImageSets/); no preparation.
# Difficult ships are ground truth (mmrotate's rule; ignore_difficult=True: the devkit's).
# The evaluation prints the three ways HRSC2016 is reported (configs/_base_/datasets/hrsc.py).
_base_ = [
    '../_base_/models/redet-le90_re50_refpn_roialign.py',
    '../_base_/datasets/hrsc.py',
    '../_base_/schedules/schedule_3x.py',
    '../_base_/default_runtime.py',
]
model = dict(roi_head=dict(
    bbox_head=[dict(head, num_classes=1) for head in _base_.model.roi_head.bbox_head]))
optim_wrapper = dict(optimizer=dict(lr=0.01))
