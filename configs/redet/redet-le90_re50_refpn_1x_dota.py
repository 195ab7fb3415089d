# ReDet, ReResNet-50 + ReFPN, 1x schedule on DOTA-v1.0 1024 x 1024 patches (the published setup).
_base_ = [
    '../_base_/models/redet-le90_re50_refpn.py',
    '../_base_/datasets/dota.py',
    '../_base_/schedules/schedule_1x.py',
    '../_base_/default_runtime.py',
]
