# The published R50 ReDet (15 DOTA classes) on the synthetic set drawn at 1024 x 1024, whose 5
# classes are DOTA class names: a GPU smoke/speed run, 400 training images = 200 iterations per
# epoch at batch 2; tools/test.py evaluates on the val split (classes without objects are left
# out of the mAP). Make the data first:
#   python tools/dataset_converters/make_synthetic_dota.py data/synthetic_dota_1024 --image-size 1024
_base_ = ['./redet-le90_re50_refpn_1x_dota.py']

data_root = 'data/synthetic_dota_1024/'
# no ImageNet ReResNet weights here: train every stage (the published run freezes the pretrained stem)
model = dict(backbone=dict(frozen_stages=-1))
train_cfg = dict(max_epochs=2, val_interval=2)
param_scheduler = [dict(type='LinearLR', start_factor=1.0 / 3, by_epoch=False, begin=0, end=100)]

train_dataloader = dict(dataset=dict(data_root=data_root))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = dict(dataset=dict(data_root=data_root, ann_file='val/labelTxt/',
                                    data_prefix=dict(img_path='val/images/'),
                                    pipeline={{_base_.val_pipeline}}))
test_evaluator = dict(_delete_=True, type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')
default_hooks = dict(logger=dict(interval=20))
