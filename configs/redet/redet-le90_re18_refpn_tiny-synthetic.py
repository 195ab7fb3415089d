# A narrow ReResNet-18 + ReFPN ReDet for the synthetic set (generated under data_root on first
# use), sized to train on a 2-core CPU in about 15 minutes (scripts/demo_main.py).
# Same architecture as the R50 model, smaller numbers.
_base_ = [
    '../_base_/models/redet-le90_re50_refpn.py',
    '../_base_/datasets/synthetic_dota.py',
    '../_base_/default_runtime.py',
]
num_classes = 5
width = 16  # channels of the first stage (2 fields x 8 orientations)
neck_channels = 32

model = dict(
    backbone=dict(depth=18, base_channels=width, frozen_stages=-1),
    neck=dict(in_channels=[width, width * 2, width * 4, width * 8], out_channels=neck_channels),
    rpn_head=dict(
        in_channels=neck_channels,
        feat_channels=neck_channels,
        # objects are 10-80 px: anchors of 16-256 px
        anchor_generator=dict(scales=[4])),
    roi_head=dict(
        # (a list replaces the base's whole: each stage is the base's with the neck's channels)
        bbox_roi_extractor=[dict(stage, out_channels=neck_channels)
                            for stage in _base_.model.roi_head.bbox_roi_extractor],
        bbox_head=[
            dict(
                type='RedetRotatedShared2FCBBoxHead',
                in_channels=neck_channels,
                fc_out_channels=256,
                num_classes=num_classes,
                bbox_coder=dict(type='RedetDeltaXYWHTHBBoxCoder', norm_factor=2, edge_swap=True,
                                target_stds=[0.1, 0.1, 0.2, 0.2, 0.1]),
                reg_class_agnostic=True),
            dict(
                type='RedetRotatedShared2FCBBoxHead',
                in_channels=neck_channels,
                fc_out_channels=256,
                num_classes=num_classes,
                bbox_coder=dict(type='RedetDeltaXYWHTRBBoxCoder', norm_factor=None, edge_swap=True,
                                proj_xy=True, target_stds=[0.05, 0.05, 0.1, 0.1, 0.05]),
                reg_class_agnostic=False),
        ]),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=[
            dict(
                assigner=dict(type='RedetMaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.5,
                              min_pos_iou=0.5, match_low_quality=False, ignore_iof_thr=-1),
                sampler=dict(type='RandomSampler', num=128, pos_fraction=0.25, neg_pos_ub=-1,
                             add_gt_as_proposals=True),
                pos_weight=-1,
                debug=False),
            dict(
                assigner=dict(type='RedetMaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.5,
                              min_pos_iou=0.5, match_low_quality=False, ignore_iof_thr=-1,
                              iou_calculator=dict(type='RedetRBboxOverlaps2D')),
                sampler=dict(type='RandomSampler', num=128, pos_fraction=0.25, neg_pos_ub=-1,
                             add_gt_as_proposals=True),
                pos_weight=-1,
                debug=False),
        ]),
    test_cfg=dict(
        rpn=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(nms_pre=1000, max_per_img=100)))

# from scratch (no ImageNet weights for a narrow equivariant net): AdamW, short warm-up;
# batch 4 (the data set's default), 100 iterations per epoch
max_epochs = 12
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
# mmengine's loops, each batch evaluated after the next batch's forward is launched: the GPU
# does not wait while the host evaluates (redet_plugin/engine/one_behind_loops.py)
val_cfg = dict(type='RedetValLoop')
test_cfg = dict(type='RedetTestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[9, 11], gamma=0.1)
]
# RedetOptimWrapper: mmengine's OptimWrapper whose clipping logs the gradient norm
# without waiting for the GPU (read back with the losses, once per log interval), and which
# skips a step whose loss or gradients are not finite, decided on the GPU (docs/failures.md)
optim_wrapper = dict(
    type='RedetOptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    clip_grad=dict(max_norm=35, norm_type=2))
# the total batch that lr is for (tools/train.py --auto-scale-lr; docs/multi_gpu.md)
auto_scale_lr = dict(enable=False, base_batch_size=4)

default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=1, max_keep_ckpts=2))
