# DOTA-v1.0 split into 1024x1024 patches with gap 200 by tools/dataset_converters/dota_split.py:
#   python tools/dataset_converters/dota_split.py data/DOTA/train data/DOTA/split_1024/train
#   (same for val and test). Needs custom_imports=dict(imports=['redet_plugin.mm']), default_scope='mmdet'.
dataset_type = 'RedetDOTADataset'
data_root = 'data/DOTA/split_1024/'
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='Resize', scale=(1024, 1024), keep_ratio=True, clip_object_border=False),
    dict(type='RandomFlip', prob=0.75, direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackDetInputs')
]
val_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(1024, 1024), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(1024, 1024), keep_ratio=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]

# 8 workers load 50 to 75 batches of two 1024² images a second on the 16-core GPU machine
# (benchmarks/detector/bench_data_loading.py, docs/performance.md; the host's speed varies from
# run to run), ahead of the captured `--amp` step (about 34 a second); 4 load 36 to 56, which in
# a slow run leaves the step no margin. Validation and test take 8 too: decoding a 1024² PNG
# (most of a worker's time per image) takes longer than the test forward, so with 2 workers the
# GPU waited for data most of each image.
train_dataloader = dict(
    batch_size=2, num_workers=8, persistent_workers=True,
    # pinned images: the data preprocessor's non_blocking copy overlaps the GPU's work
    pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='train/labelTxt/',
                 data_prefix=dict(img_path='train/images/'), filter_cfg=dict(filter_empty_gt=True),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=8, persistent_workers=True, drop_last=False,
    # pinned images: the data preprocessor's copy to the GPU is a DMA the host does not wait
    # for (a pageable image is first copied by the host into a staging buffer)
    pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='val/labelTxt/',
                 data_prefix=dict(img_path='val/images/'), test_mode=True, pipeline=val_pipeline))
val_evaluator = dict(type='RedetDOTAMetric', iou_thrs=0.5, ap_method='11points')

# Test set (no annotations): write Task1 submission files, patches merged to full images.
test_dataloader = dict(
    batch_size=1, num_workers=8, persistent_workers=True, drop_last=False, pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='',
                 data_prefix=dict(img_path='test/images/'), test_mode=True, pipeline=test_pipeline))
test_evaluator = dict(type='RedetDOTAMetric', format_only=True, merge_patches=True,
                      outfile_prefix='./work_dirs/dota/Task1')
