# ReDet's best DOTA-v1.5 recipe: redet-le90_re50_refpn_rr-1x_dota-ms.py (patches of three scales,
# 0.5, 1.0 and 1.5, random rotation) on DOTA-v1.5, with the model of redet-le90_re50_refpn_1x_dota15.py
# (16 classes, RoIAlign in stage 1). ReDet's README: 76.80 mAP on the DOTA server
# (ReDet_re50_refpn_1x_dota15_ms.py); mmrotate has no such config.
#
# 1. Split DOTA-v1.5 (data/DOTA15/{train,val,test} as downloaded; test has images only), train
#    and val into one trainval folder:
#   python tools/dataset_converters/dota_split.py data/DOTA15/train data/DOTA15/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA15/val data/DOTA15/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA15/test data/DOTA15/split_ms_1024/test --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
# 2. Train (no validation: train + val are the training set):
#   python tools/train.py configs/redet/redet-le90_re50_refpn_rr-1x_dota15-ms.py
# 3. Detect on the test patches, merged back into the full test images, and write the submission
#    work_dirs/dota15_ms/Task1/Task1_<class>.txt (zip the 16 files for the DOTA server):
#   python tools/test.py configs/redet/redet-le90_re50_refpn_rr-1x_dota15-ms.py \
#       work_dirs/redet-le90_re50_refpn_rr-1x_dota15-ms/epoch_12.pth
# Difficult objects: the devkit's rule (ignore_difficult=True), as the other DOTA configs.
_base_ = [
    '../_base_/models/redet-le90_re50_refpn_roialign.py',
    '../_base_/datasets/dota_ms.py',
    '../_base_/schedules/schedule_1x.py',
    '../_base_/default_runtime.py',
]
val_cfg = None
model = dict(roi_head=dict(
    bbox_head=[dict(head, num_classes=16) for head in _base_.model.roi_head.bbox_head]))
# DOTA-v1.5's first 15 classes are DOTA-v1.0's: the rotation's upright classes (storage-tank,
# roundabout) keep their labels.
dataset_type = 'RedetDOTAv15Dataset'
data_root = 'data/DOTA15/split_ms_1024/'
train_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root))
test_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root))
test_evaluator = dict(outfile_prefix='./work_dirs/dota15_ms/Task1')
