"""Train a detector from a config with mmengine's Runner.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp] [--auto-scale-lr]
                          [--cfg-options key=value ...] [--launcher pytorch]
"""
import argparse
import os.path as osp
import sys

from redet_plugin.utils.transformers_hidden import transformers_hidden

with transformers_hidden(sys.argv[1:] if __name__ == '__main__' else None):
    from mmengine.config import Config
    from mmengine.runner import Runner, find_latest_checkpoint

    from redet_plugin.engine.cli import (add_runner_args, check_classes, check_data_folders,
                                         checked_checkpoint_load, data_errors_in_one_line, fail,
                                         gpu_available, load_config, parse_runner_args,
                                         training_stops_in_one_line)
    from redet_plugin.engine.cpu_distributed import end_distributed, setup_cpu_distributed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a rotated detector')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='folder for logs and checkpoints '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', const='auto', default=None,
                        help="resume training: 'auto' (or no value) = from the latest checkpoint "
                        'in the work dir; or a checkpoint path')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision (an AMP optim wrapper); needs a GPU')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the learning rate linearly with the total batch (GPUs x "
                        "batch per GPU) over the config's auto_scale_lr.base_batch_size")
    add_runner_args(parser)
    return parse_runner_args(parser, argv)


def build_config(args) -> Config:
    cfg = load_config(args)
    if args.amp:
        if not gpu_available():  # mmengine would only fail after building everything
            fail('--amp needs a GPU (mixed precision runs on CUDA, NPU, MLU or MUSA devices); '
                 'none is available')
        # RedetOptimWrapper -> RedetAmpOptimWrapper: non-finite steps skipped and the loss
        # scaler's inf check kept on the GPU (mmengine's AmpOptimWrapper reads it every step)
        amp_types = dict(OptimWrapper='AmpOptimWrapper', RedetOptimWrapper='RedetAmpOptimWrapper')
        if cfg.optim_wrapper.get('type', 'OptimWrapper') not in amp_types:
            fail('--amp: expected optim_wrapper type OptimWrapper or RedetOptimWrapper, got '
                 f'{cfg.optim_wrapper.type}')
        cfg.optim_wrapper.type = amp_types[cfg.optim_wrapper.get('type', 'OptimWrapper')]
        cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        if not (cfg.get('auto_scale_lr') or {}).get('base_batch_size'):
            fail('--auto-scale-lr: the config sets no auto_scale_lr.base_batch_size (the total '
                 'batch its learning rate is for)')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            fail(f'--resume: checkpoint {args.resume!r} does not exist')
        cfg.resume, cfg.load_from = True, args.resume
    if cfg.get('load_from') and '://' not in cfg.load_from and not osp.isfile(cfg.load_from):
        fail(f'load_from: checkpoint {cfg.load_from!r} does not exist')
    # mmengine's Iter/EpochBasedTrainLoop as the plugin's: a resumed run continues at the batch,
    # with the random draws, of the run it resumes (redet_plugin/engine/resumable_loops.py)
    from redet_plugin.engine.resumable_loops import resumable_train_cfg
    cfg.train_cfg = resumable_train_cfg(cfg.get('train_cfg'))
    # and mmengine's CheckpointHook as the plugin's, which writes last_checkpoint atomically once
    # the checkpoint it names is whole (redet_plugin/engine/checkpoint_hook.py)
    checkpoint_hook = (cfg.get('default_hooks') or {}).get('checkpoint')
    if checkpoint_hook and checkpoint_hook.get('type') in ('CheckpointHook', 'mmengine.CheckpointHook'):
        checkpoint_hook.type = 'mmdet.RedetCheckpointHook'
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_config(args)
    run_training(cfg)
    end_distributed()


def run_training(cfg) -> None:
    """The Runner lives only here: ending the process group needs it gone (end_distributed)."""
    check_data_folders(cfg, ('train_dataloader', 'val_dataloader'))
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg)
    from redet_plugin.engine import BadImagesHook, NonFiniteStepsHook, remove_partial_writes
    runner.register_hook(BadImagesHook())  # lists the images on_bad_image='skip' left out
    if not any(isinstance(hook, NonFiniteStepsHook) for hook in runner.hooks):
        # names the steps skipped as non-finite (configs on default_runtime.py have it)
        runner.register_hook(NonFiniteStepsHook())
    if cfg.resume and runner.rank == 0:  # temporary files of checkpoint writes a kill cut short
        remove_partial_writes(cfg.work_dir)
    resume_from = cfg.load_from if cfg.resume and cfg.load_from else (
        find_latest_checkpoint(cfg.work_dir) if cfg.resume else None)
    # The checkpoint is checked when the Runner reads it: a resumed run continues on its
    # classes; fine-tuning may change the heads and the classes, but most weights must fit.
    load_from = cfg.get('load_from')
    if resume_from or not load_from or '://' in load_from:  # URLs: mmengine downloads them
        load_from = None
    with data_errors_in_one_line():
        dataset = runner.train_dataloader.dataset
        if resume_from:
            checked = checked_checkpoint_load(runner, resume_from, strict=True,
                                              classes=dataset.metainfo.get('classes') or ())
        else:
            check_classes(runner.model, dataset)
            checked = checked_checkpoint_load(runner, load_from, strict=False)
        with checked, training_stops_in_one_line():
            runner.train()


if __name__ == '__main__':
    main()
