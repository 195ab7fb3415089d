# DOTA-v1.0 split at three scales (rates 0.5, 1.0, 1.5) into 1024 x 1024 patches with gap 500,
# as ReDet's and mmrotate's multi-scale splits (mmrotate: split_configs/dota1_0/ms_*.json), by
# tools/dataset_converters/dota_split.py (DOTA as downloaded in data/DOTA/{train,val,test}; test has no labelTxt):
#   python tools/dataset_converters/dota_split.py data/DOTA/train data/DOTA/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA/val data/DOTA/split_ms_1024/trainval --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
#   python tools/dataset_converters/dota_split.py data/DOTA/test data/DOTA/split_ms_1024/test --patch-size 1024 --gap 500 --rates 0.5 1.0 1.5
# Patch ids are `<image>__<rate>__<left>___<top>`, (left, top) in the image scaled by rate: the
# test metric maps every patch's detections back to its full image (coordinates / rate) and
# merges the rates and overlaps with rotated NMS.
# mmrotate's _base_/datasets/dota_ms.py with our names. Needs
# custom_imports=dict(imports=['redet_plugin.mm']), default_scope='mmdet' (the model base declares both).
dataset_type = 'RedetDOTADataset'
data_root = 'data/DOTA/split_ms_1024/'
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=(1024, 1024), keep_ratio=True, clip_object_border=False),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    # any angle in [-180, 180] degrees; an image with a storage tank (9) or a roundabout (11),
    # which DOTA annotates as upright rectangles, only by a multiple of 90 degrees
    dict(type='RedetRandomRotate', prob=0.5, max_angle=180, rect_obj_labels=[9, 11]),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(1024, 1024), keep_ratio=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]

train_dataloader = dict(
    batch_size=2, num_workers=8, persistent_workers=True, pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='trainval/labelTxt/',
                 data_prefix=dict(img_path='trainval/images/'), filter_cfg=dict(filter_empty_gt=True),
                 pipeline=train_pipeline))
# No validation: the recipe trains on train + val, and its figure is the DOTA server's on the
# test set (mmrotate's dota_ms.py "validates" on the training patches). The configs that use
# this base set val_cfg = None as well.
val_dataloader = None
val_evaluator = None

# Test set (no annotations): the patches of all three rates merged back into each full image
# (rotated NMS at IoU 0.1) and written as DOTA Task1 submission files, one per class.
test_dataloader = dict(
    batch_size=1, num_workers=8, persistent_workers=True, drop_last=False, pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='',
                 data_prefix=dict(img_path='test/images/'), test_mode=True, pipeline=test_pipeline))
test_evaluator = dict(type='RedetDOTAMetric', format_only=True, merge_patches=True, nms_iou_thr=0.1,
                      outfile_prefix='./work_dirs/dota_ms/Task1')
