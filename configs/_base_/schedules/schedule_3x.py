# 36 epochs, lr steps at 24 and 33 (mmrotate's schedule_3x: HRSC2016), the rest as schedule_1x.
_base_ = ['./schedule_1x.py']
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=36, val_interval=12)
param_scheduler = [
    dict(type='LinearLR', start_factor=1.0 / 3, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[24, 33], gamma=0.1)
]
