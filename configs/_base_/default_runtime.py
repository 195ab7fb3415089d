default_scope = 'mmdet'

default_hooks = dict(
    # mmengine's RuntimeInfoHook, reading the losses back from the GPU once per log interval
    # instead of every iteration (redet_plugin/engine/runtime_info_hook.py)
    runtime_info=dict(type='RedetRuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # checkpoints and last_checkpoint written whole or not at all (a temporary file renamed onto
    # the name: redet_plugin/engine/atomic_local_backend.py), last_checkpoint only once the
    # checkpoint it names is whole, old checkpoints removed only after that
    # (redet_plugin/engine/checkpoint_hook.py), so a killed run resumes
    checkpoint=dict(type='RedetCheckpointHook', interval=1, max_keep_ckpts=3,
                    backend_args=dict(backend='redet_atomic_local')),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='DetVisualizationHook'),
    # RedetOptimWrapper skips a step whose loss or gradients are not finite (the weights, the
    # optimizer state and the BN statistics stay as they were); this hook logs each with its
    # iteration and images, and stops the run after more than max_consecutive_nonfinite in a row
    # (redet_plugin/engine/nonfinite_steps_hook.py, docs/failures.md)
    nonfinite_steps=dict(type='RedetNonFiniteStepsHook', max_consecutive_nonfinite=20))

# on several GPUs (tools/dist_train.sh): mmengine's DDP wrapper, with the model's captured training
# step (cuda_graph_step) and its gradient all-reduce in one CUDA graph
# (redet_plugin/engine/distributed_data_parallel.py); mmengine's defaults otherwise
model_wrapper_cfg = dict(type='RedetDistributedDataParallel', broadcast_buffers=False,
                         find_unused_parameters=False)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
# draws rotated boxes (tools/test.py --show-dir)
visualizer = dict(type='RedetRotatedDetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)

log_level = 'INFO'
load_from = None
resume = False
