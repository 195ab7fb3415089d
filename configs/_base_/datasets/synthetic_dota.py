# The embedded synthetic DOTA-format data set (5 classes, 256x256 images), generated under
# data_root on first use. Needs custom_imports=dict(imports=['redet_plugin.mm']) and default_scope='mmdet'.
dataset_type = 'RedetSyntheticDOTADataset'
data_root = 'data/synthetic_dota/'
synthetic = dict(num_train=400, num_val=100, image_size=256, seed=0)
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=(256, 256), keep_ratio=True, clip_object_border=False),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='RedetRandomRotate90', prob=0.5),
    dict(type='PackDetInputs')
]
# Annotations are loaded after Resize: they stay in original coordinates, like the predictions.
val_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
test_pipeline = val_pipeline

train_dataloader = dict(
    batch_size=4, num_workers=2, persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(type=dataset_type, data_root=data_root, synthetic=synthetic,
                 ann_file='train/labelTxt/', data_prefix=dict(img_path='train/images/'),
                 filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=2, persistent_workers=True, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, synthetic=synthetic,
                 ann_file='val/labelTxt/', data_prefix=dict(img_path='val/images/'),
                 test_mode=True, pipeline=val_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')
test_evaluator = val_evaluator
