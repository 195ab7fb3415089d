# ReDet (ReResNet-50 + ReFPN + RPN + two-stage RoI Transformer), as published (mmrotate 1.x
# redet-le90_re50_refpn_1x_dota). Rotated boxes are (cx, cy, w, h, theta) in le90.
# Registers redet_plugin's components (models, and the data sets, metric and visualizer of the
# other _base_ files) in mmdet's registries for every config built on this model.
custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)
angle_version = 'le90'
model = dict(
    type='RedetReDet',
    data_preprocessor=dict(
        type='RedetDetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32,
        boxtype2tensor=False,
        # copies the batch to the GPU without waiting for the GPU. Safe: from pageable memory
        # (the annotations) CUDA stages the data before the call returns; pinned memory (the
        # images with pin_memory=True) is not reused by torch before the copy has ended
        non_blocking=True),
    # on a GPU, the whole training step (forward, backward, clipping, optimizer step) and the
    # whole test forward replayed as one CUDA graph each: the same results, no host time per
    # step (docs/detector.md; redet_plugin/cuda_graphs/). Where a graph cannot serve (the CPU,
    # more layouts than max_graphs, ...) the eager path runs, with one line saying why.
    # `--cfg-options model.cuda_graphs=False` turns every CUDA graph off. (A dict is on with its
    # class's default arguments; a config may then set some of them, or False.)
    cuda_graph_step=dict(),
    cuda_graph_predict=dict(),
    # backbone + neck as graphs of their own would serve only the eager steps (the warm-up)
    cuda_graph_features=False,
    # every feature map channels-last (NHWC), the layout cuDNN's TF32 and fp16 convolutions
    # use: no layout conversion around each convolution, a faster step in fp32 and under --amp
    # (docs/performance.md); the same results. False: NCHW
    channels_last=True,
    # on a GPU, the test forward's float32 matrix products (the R-CNN heads' linear layers) in
    # TF32, as cuDNN runs the float32 convolutions (docs/detector.md). False: full float32 there
    tf32_predict=True,
    backbone=dict(
        type='RedetReResNet',
        depth=50,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=1,
        style='pytorch',
        # the published model starts from ImageNet-trained ReResNet-50 weights (ReDet's
        # re_resnet50_c8_batch256-25b16846.pth, an mmcls checkpoint: 'backbone.*' + 'head.*'):
        # init_cfg=dict(type='Pretrained', prefix='backbone.',
        #               checkpoint='work_dirs/pretrain/re_resnet50_c8_batch256-25b16846.pth')
        # Without prefix='backbone.' (as in mmrotate's config) no key matches and nothing loads.
        ),
    neck=dict(
        type='RedetReFPN',
        in_channels=[256, 512, 1024, 2048],
        out_channels=256,
        num_outs=5),
    # mmdet's RPNHead with fixed-size targets and proposals: no host waits
    # (redet_plugin/models/dense_heads/rpn_head.py); its weights are RPNHead's
    rpn_head=dict(
        type='RedetRPNHead',
        in_channels=256,
        feat_channels=256,
        anchor_generator=dict(
            type='AnchorGenerator',
            scales=[8],
            ratios=[0.5, 1.0, 2.0],
            strides=[4, 8, 16, 32, 64]),
        bbox_coder=dict(
            type='RedetDeltaXYWHBBoxCoder',
            target_means=[.0, .0, .0, .0],
            target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='RedetSmoothL1Loss', beta=1.0 / 9.0, loss_weight=1.0)),
    roi_head=dict(
        type='RedetRoITransformerRoIHead',
        num_stages=2,
        stage_loss_weights=[1, 1],
        bbox_roi_extractor=[
            # stage 1: horizontal proposals (configs/redet/redet-le90_re50_refpn_roialign_1x_dota.py
            # pools them with RoIAlign, as mmrotate does)
            dict(
                type='RedetHorizontalSingleRoIExtractor',
                roi_layer=dict(type='RedetRoIPool', output_size=7),
                out_channels=256,
                featmap_strides=[4, 8, 16, 32]),
            # stage 2: rotated RoIs, orientation-aligned
            dict(
                type='RedetRotatedSingleRoIExtractor',
                roi_layer=dict(
                    type='RedetRiRoIAlignRotated',
                    output_size=7,
                    num_samples=2,
                    num_orientations=8,
                    clockwise=True),
                out_channels=256,
                featmap_strides=[4, 8, 16, 32]),
        ],
        bbox_head=[
            dict(
                type='RedetRotatedShared2FCBBoxHead',
                in_channels=256,
                fc_out_channels=1024,
                roi_feat_size=7,
                num_classes=15,
                bbox_coder=dict(
                    type='RedetDeltaXYWHTHBBoxCoder',
                    angle_version=angle_version,
                    norm_factor=2,
                    edge_swap=True,
                    target_means=[.0, .0, .0, .0, .0],
                    target_stds=[0.1, 0.1, 0.2, 0.2, 0.1]),
                reg_class_agnostic=True,
                loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                loss_bbox=dict(type='RedetSmoothL1Loss', beta=1.0, loss_weight=1.0)),
            dict(
                type='RedetRotatedShared2FCBBoxHead',
                in_channels=256,
                fc_out_channels=1024,
                roi_feat_size=7,
                num_classes=15,
                bbox_coder=dict(
                    type='RedetDeltaXYWHTRBBoxCoder',
                    angle_version=angle_version,
                    norm_factor=None,
                    edge_swap=True,
                    proj_xy=True,
                    target_means=[.0, .0, .0, .0, .0],
                    target_stds=[0.05, 0.05, 0.1, 0.1, 0.05]),
                reg_class_agnostic=False,
                loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                loss_bbox=dict(type='RedetSmoothL1Loss', beta=1.0, loss_weight=1.0)),
        ]),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type='RedetMaxIoUAssigner',
                pos_iou_thr=0.7,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1),
            sampler=dict(
                type='RandomSampler',
                num=256,
                pos_fraction=0.5,
                neg_pos_ub=-1,
                add_gt_as_proposals=False),
            allowed_border=0,
            pos_weight=-1,
            debug=False),
        rpn_proposal=dict(
            nms_pre=2000,
            max_per_img=2000,
            nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=[
            # stage 1: horizontal priors vs the gts' enclosing horizontal boxes
            dict(
                assigner=dict(
                    type='RedetMaxIoUAssigner',
                    pos_iou_thr=0.5,
                    neg_iou_thr=0.5,
                    min_pos_iou=0.5,
                    match_low_quality=False,
                    ignore_iof_thr=-1),
                sampler=dict(
                    type='RandomSampler',
                    num=512,
                    pos_fraction=0.25,
                    neg_pos_ub=-1,
                    add_gt_as_proposals=True),
                pos_weight=-1,
                debug=False),
            # stage 2: rotated priors vs rotated gts
            dict(
                assigner=dict(
                    type='RedetMaxIoUAssigner',
                    pos_iou_thr=0.5,
                    neg_iou_thr=0.5,
                    min_pos_iou=0.5,
                    match_low_quality=False,
                    iou_calculator=dict(type='RedetRBboxOverlaps2D'),
                    ignore_iof_thr=-1),
                sampler=dict(
                    type='RandomSampler',
                    num=512,
                    pos_fraction=0.25,
                    neg_pos_ub=-1,
                    add_gt_as_proposals=True),
                pos_weight=-1,
                debug=False)
        ]),
    test_cfg=dict(
        rpn=dict(
            nms_pre=2000,
            max_per_img=2000,
            nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            nms_pre=2000,
            min_bbox_size=0,
            score_thr=0.05,
            nms=dict(type='nms_rotated', iou_threshold=0.1),
            max_per_img=2000)))
