# ReDet, ReResNet-50 + ReFPN, 1x schedule on DOTA-v2.0 1024 x 1024 patches: 18 classes
# (DOTA-v1.5's and 'airport', 'helipad'), as mmrotate's _base_/datasets/dotav2.py; otherwise the
# DOTA-v1.5 setup (redet-le90_re50_refpn_1x_dota15.py). Prepare:
#   python tools/dataset_converters/dota_split.py data/DOTA2/train data/DOTA2/split_1024/train
#   (the same for val and test). Difficult objects: the devkit's rule (ignore_difficult=True), as
#   the DOTA-v1.0 configs; dataset=dict(ignore_difficult=False) for mmrotate's.
_base_ = ['./redet-le90_re50_refpn_1x_dota15.py']
model = dict(roi_head=dict(
    bbox_head=[dict(head, num_classes=18) for head in _base_.model.roi_head.bbox_head]))
dataset_type = 'RedetDOTAv2Dataset'
data_root = 'data/DOTA2/split_1024/'
train_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root))
val_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root))
test_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root))
# Task1 files of this data set's test split in a folder of their own (not DOTA-v1.0's).
test_evaluator = dict(outfile_prefix='./work_dirs/dota2/Task1')
