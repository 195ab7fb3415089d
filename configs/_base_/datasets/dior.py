# DIOR-R (20 classes, 800 x 800 images), in the data set's own layout under data_root:
# JPEGImages-trainval/, JPEGImages-test/, Annotations/Oriented Bounding Boxes/ and
# ImageSets/Main/{train,val,test}.txt. mmrotate's _base_/datasets/dior.py with our names:
# trained on train + val, evaluated on test (VOC07 11-point AP at IoU 0.5).
# Needs custom_imports=dict(imports=['redet_plugin.mm']), default_scope='mmdet' (the model base
# declares both).
dataset_type = 'RedetDIORDataset'
data_root = 'data/DIOR/'
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=(800, 800), keep_ratio=True, clip_object_border=False),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackDetInputs')
]
# Annotations are loaded after Resize: they stay in original coordinates, like the predictions.
val_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(800, 800), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
test_pipeline = val_pipeline

train_dataloader = dict(
    batch_size=2, num_workers=2, persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(
        type='ConcatDataset',
        datasets=[
            dict(type=dataset_type, data_root=data_root, ann_file=f'ImageSets/Main/{split}.txt',
                 data_prefix=dict(img_path='JPEGImages-trainval'),
                 filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline,
                 backend_args=backend_args)
            for split in ('train', 'val')
        ]))
val_dataloader = dict(
    batch_size=1, num_workers=2, persistent_workers=True, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='ImageSets/Main/test.txt',
                 data_prefix=dict(img_path='JPEGImages-test'), test_mode=True,
                 pipeline=val_pipeline, backend_args=backend_args))
test_dataloader = val_dataloader

val_evaluator = dict(type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')
test_evaluator = val_evaluator
