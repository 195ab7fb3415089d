# HRSC2016 (ships; one class 'ship' with classwise=False, as mmrotate), in the data set's own
# layout under data_root: FullDataSet/{AllImages,Annotations}/ and ImageSets/{trainval,test}.txt.
# mmrotate's _base_/datasets/hrsc.py with our names: boxes loaded as 'redet_rbox'.
# Needs custom_imports=dict(imports=['redet_plugin.mm']), default_scope='mmdet' (the model base
# declares both).
dataset_type = 'RedetHRSCDataset'
data_root = 'data/hrsc/'
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=(800, 512), keep_ratio=True, clip_object_border=False),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackDetInputs')
]
# Annotations are loaded after Resize: they stay in original coordinates, like the predictions.
val_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(800, 512), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(800, 512), keep_ratio=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]

train_dataloader = dict(
    batch_size=2, num_workers=2, persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='ImageSets/trainval.txt',
                 data_prefix=dict(sub_data_root='FullDataSet/'), classwise=False,
                 filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline,
                 backend_args=backend_args))
val_dataloader = dict(
    batch_size=1, num_workers=2, persistent_workers=True, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='ImageSets/test.txt',
                 data_prefix=dict(sub_data_root='FullDataSet/'), classwise=False, test_mode=True,
                 pipeline=val_pipeline, backend_args=backend_args))
test_dataloader = val_dataloader

# HRSC2016 is published three ways; one evaluation prints all of them (rotated IoU):
#   hrsc_voc07/AP50  VOC07 11-point AP at IoU 0.5: ReDet's paper (R50: 90.46);
#   hrsc_voc07/mAP, hrsc_voc07/AP50, hrsc_voc07/AP75  the COCO-style mean of the 11-point AP
#       over IoU 0.50:0.05:0.95, and two of its thresholds: mmrotate's model zoo (ReDet
#       "mAP 72.31/90.40/89.50", evaluated by mmrotate 0.x's HRSCDataset: use_07_metric=True at
#       these ten thresholds); hrsc_voc07/AP55 ... AP95 are the other thresholds;
#   hrsc_voc12/AP50  VOC12 area under the PR curve at IoU 0.5 (hrsc_voc12/mAP is the same figure).
# mmrotate 1.x's own _base_/datasets/hrsc.py reports the first only (DOTAMetric's defaults).
val_evaluator = [
    dict(type='RedetDOTAMetric', ap_method='11points', prefix='hrsc_voc07',
         iou_thrs=[0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]),
    dict(type='RedetDOTAMetric', ap_method='area', iou_thrs=0.5, prefix='hrsc_voc12'),
]
test_evaluator = val_evaluator
