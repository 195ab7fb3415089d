# 12 epochs, SGD lr 0.005 (batch 2 on one GPU), linear warm-up 500 iterations, steps at 8 and 11.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=12)
# mmengine's loops, each batch evaluated after the next batch's forward is launched: the GPU
# does not wait while the host evaluates (redet_plugin/engine/one_behind_loops.py)
val_cfg = dict(type='RedetValLoop')
test_cfg = dict(type='RedetTestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=1.0 / 3, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]

# RedetOptimWrapper: mmengine's OptimWrapper whose clipping logs the gradient norm
# without waiting for the GPU (read back with the losses, once per log interval), and which
# skips a step whose loss or gradients are not finite, decided on the GPU (docs/failures.md)
optim_wrapper = dict(
    type='RedetOptimWrapper',
    optimizer=dict(type='SGD', lr=0.005, momentum=0.9, weight_decay=0.0001),
    clip_grad=dict(max_norm=35, norm_type=2))
# the total batch (GPUs x batch per GPU) that lr is for: tools/train.py --auto-scale-lr scales lr
# linearly to another total batch (docs/multi_gpu.md)
auto_scale_lr = dict(enable=False, base_batch_size=2)
