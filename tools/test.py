"""Evaluate a checkpoint with the config's test set and metric (DOTA mAP, per-class table).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--amp] [--equivariant]
                         [--show-dir DIR] [--score-thr 0.3] [--cfg-options ...] [--launcher pytorch]
"""
import argparse
import json
import os.path as osp
import sys

from redet_plugin.utils.transformers_hidden import transformers_hidden

with transformers_hidden(sys.argv[1:] if __name__ == '__main__' else None):
    from mmengine.config import Config
    from mmengine.runner import Runner

    from redet_plugin.engine import PlainTestHook, ProgressBarHook
    from redet_plugin.engine.cli import (add_runner_args, check_data_folders, checked_checkpoint_load,
                                         data_errors_in_one_line, fail, gpu_available, load_config,
                                         parse_runner_args)
    from redet_plugin.engine.cpu_distributed import end_distributed, setup_cpu_distributed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a rotated detector')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='folder for the evaluation log and '
                        'test_metrics.json')
    parser.add_argument('--out', help='dump the raw predictions to this .pkl file')
    parser.add_argument('--show-dir', help='write pictures of the rotated detections here')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='lowest score drawn in the pictures')
    parser.add_argument('--amp', action='store_true',
                        help='test in mixed precision (float16 autocast); needs a GPU')
    parser.add_argument('--equivariant', action='store_true',
                        help="keep e2cnn's modules at test time (by default the backbone and neck "
                        'run as plain convolutions with folded batch norms: the same detections, '
                        'faster)')
    add_runner_args(parser)
    return parse_runner_args(parser, argv)


def build_config(args) -> Config:
    if not osp.isfile(args.checkpoint):
        fail(f'checkpoint {args.checkpoint!r} does not exist')
    if args.out and not args.out.endswith(('.pkl', '.pickle')):
        fail(f'--out: expected a .pkl file, got {args.out!r}')
    cfg = load_config(args)
    if args.amp:
        if not gpu_available():  # mmengine would only fail after building everything
            fail('--amp needs a GPU (mixed precision runs on CUDA, NPU, MLU or MUSA devices); '
                 'none is available')
        cfg.test_cfg = dict(cfg.get('test_cfg') or dict(type='TestLoop'), fp16=True)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.show_dir:  # mmdet's hook, with the config's (rotated) visualizer
        cfg.default_hooks.visualization.update(
            draw=True, test_out_dir=osp.abspath(args.show_dir), score_thr=args.score_thr)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_config(args)
    metrics = run_test(args, cfg)
    end_distributed()
    return metrics


def run_test(args, cfg) -> dict:
    """The Runner lives only here: ending the process group needs it gone (end_distributed)."""
    check_data_folders(cfg, ('test_dataloader',))
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg)
    with data_errors_in_one_line():
        classes = runner.test_dataloader.dataset.metainfo.get('classes') or ()
        runner.register_hook(ProgressBarHook(), priority='VERY_LOW')
        if not args.equivariant:
            runner.register_hook(PlainTestHook())
        from redet_plugin.engine import BadImagesHook
        runner.register_hook(BadImagesHook())  # lists the images on_bad_image='skip' left out
        if args.out:
            from mmdet.evaluation import DumpDetResults
            runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
        with checked_checkpoint_load(runner, args.checkpoint, strict=True, classes=classes):
            metrics = runner.test()
    if runner.rank == 0:  # for scripts (scripts/demo_main.py) and for the record
        with open(osp.join(cfg.work_dir, 'test_metrics.json'), 'w') as f:
            json.dump(metrics, f, indent=1)
    return metrics


if __name__ == '__main__':
    main()
