# The embedded synthetic DOTA-format set (python tools/data/make_synthetic_dota.py):
# 256 x 256 images, 5 classes, data_root/{train,val}/{images,labelTxt}.
_base_ = './dota.py'

data_root = 'data/synthetic_dota/'
metainfo = dict(classes=('plane', 'ship', 'storage-tank', 'small-vehicle', 'tennis-court'))
image_size = (256, 256)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, box_type='rbox'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackDetInputs')
]
val_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='rbox'),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
test_pipeline = val_pipeline

train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=val_pipeline))
test_dataloader = val_dataloader
