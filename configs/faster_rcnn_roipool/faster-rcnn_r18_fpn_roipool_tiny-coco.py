# mmdet's own Faster R-CNN (ResNet-18 + FPN, narrowed) whose second stage pools RoIs with
# redet_plugin's RoIPool. The only plugin pieces: `custom_imports` (registers our components in
# mmdet's registries) and the RoI extractor entry below. mmdet's SingleRoIExtractor resolves a
# string roi_layer type in mmcv.ops only (it would build mmcv's CUDA-only RoIPool), so the
# extractor is our HorizontalSingleRoIExtractor: mmdet's SingleRoIExtractor with the layer name
# looked up in mmdet's MODELS first. Data: a tiny COCO-format set under data/tiny_coco/ (the test
# writes one); train with mmdet's tools:
#   python $(python -c "import mmdet, os; print(os.path.dirname(mmdet.__file__))")/.mim/tools/train.py \
#       configs/faster_rcnn_roipool/faster-rcnn_r18_fpn_roipool_tiny-coco.py
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)

data_root = 'data/tiny_coco/'
classes = ('box', 'disc')
image_scale = (128, 128)
channels = 64

model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        bbox_roi_extractor=dict(
            type='RedetHorizontalSingleRoIExtractor',
            roi_layer=dict(_delete_=True, type='RedetRoIPool', output_size=7),
            out_channels=channels),
        bbox_head=dict(in_channels=channels, fc_out_channels=128, num_classes=len(classes))),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=200, max_per_img=100),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=200, max_per_img=100)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                 ann_file='annotations/train.json', data_prefix=dict(img='images/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=4), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                 ann_file='annotations/val.json', data_prefix=dict(img='images/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator

train_cfg = dict(max_epochs=1, val_interval=1)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4)]
optim_wrapper = dict(optimizer=dict(lr=0.01))
default_hooks = dict(logger=dict(interval=1))
log_processor = dict(window_size=1)
