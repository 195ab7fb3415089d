# The R50 ReDet with RoIAlign instead of RoIPool in the first (horizontal) stage, as
# mmrotate's config does; everything else as redet-le90_re50_refpn_1x_dota.py.
_base_ = [
    '../_base_/models/redet-le90_re50_refpn_roialign.py',
    '../_base_/datasets/dota.py',
    '../_base_/schedules/schedule_1x.py',
    '../_base_/default_runtime.py',
]
