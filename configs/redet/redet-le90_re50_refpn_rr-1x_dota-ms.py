# ReDet's best DOTA-v1.0 recipe: ReResNet-50 + ReFPN, 1x schedule, trained and tested on patches
# of three scales (0.5, 1.0, 1.5) with random rotation (mmrotate's
# redet-le90_re50_refpn_rr-1x_dota-ms.py: 79.87 mAP on the DOTA server; ReDet's paper: 80.10).
# The model is redet-le90_re50_refpn_1x_dota.py's.
#
# 1. Split DOTA-v1.0 (data/DOTA/{train,val,test} as downloaded; test has images only), train
#    and val into one trainval folder:
#   python tools/dataset_converters/dota_split.py data/DOTA/train data/DOTA/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA/val data/DOTA/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA/test data/DOTA/split_ms_1024/test --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
# 2. Train (no validation: train + val are the training set):
#   python tools/train.py configs/redet/redet-le90_re50_refpn_rr-1x_dota-ms.py
# 3. Detect on the test patches, merged back into the full test images, and write the submission
#    work_dirs/dota_ms/Task1/Task1_<class>.txt (zip the 15 files for the DOTA server):
#   python tools/test.py configs/redet/redet-le90_re50_refpn_rr-1x_dota-ms.py \
#       work_dirs/redet-le90_re50_refpn_rr-1x_dota-ms/epoch_12.pth
_base_ = [
    '../_base_/models/redet-le90_re50_refpn.py',
    '../_base_/datasets/dota_ms.py',
    '../_base_/schedules/schedule_1x.py',
    '../_base_/default_runtime.py',
]
val_cfg = None
