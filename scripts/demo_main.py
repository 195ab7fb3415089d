"""The demo on a CPU machine: synthetic data -> train the tiny ReDet -> test.

    python scripts/demo_main.py [--work-dir work_dirs/demo] [--data-root data/synthetic_dota]
                                [--quick]

1. generates the synthetic DOTA-format set (the config's parameters) under --data-root unless
   it is already there;
2. trains configs/redet/redet-le90_re18_refpn_tiny-synthetic.py (tools/train.py; --resume auto, so a
   stopped run continues);
3. evaluates the last checkpoint on the val split (tools/test.py): per-class table, mAP@0.5,
   pictures of the rotated detections in <work-dir>/pictures, results in <work-dir>/results.pkl;
4. plots the loss / mAP curves to <work-dir>/curves.png.
--quick runs the same path on a handful of small images for one short epoch (for CI), in
work_dirs/demo_quick and data/synthetic_dota_quick unless told otherwise.
A work dir keeps one run (its settings in demo_main.json) and a data root one synthetic set: the
demo refuses to resume from, or write over, a run or a set made with other settings.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time

from redet_plugin.engine.cli import fail

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEFAULT_CONFIG = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
RECORD = 'demo_main.json'  # in the work dir: the settings of the run it holds


def run(step: str, args: list) -> None:
    print(f'\n=== {step}: {" ".join(args)}', flush=True)
    result = subprocess.run([sys.executable] + args, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f'error: {step} failed (exit code {result.returncode})')


def default_dirs(quick: bool):
    """(work dir, data root): --quick has its own, so that it never touches the full run's."""
    suffix = '_quick' if quick else ''
    return (osp.join(ROOT, f'work_dirs/demo{suffix}'), osp.join(ROOT, f'data/synthetic_dota{suffix}'))


def claim_work_dir(work_dir: str, settings: dict) -> None:
    """Takes the work dir for a run of these settings: a stopped run of the same settings is
    resumed, but another run's checkpoints are neither resumed from nor written over."""
    record = osp.join(work_dir, RECORD)
    if osp.isfile(record):
        with open(record) as f:
            saved = json.load(f)
        if saved != settings:
            kind = {True: 'a --quick run', False: 'a full run'}
            what = (f'{kind[bool(saved.get("quick"))]}, this is {kind[settings["quick"]]}'
                    if bool(saved.get('quick')) != settings['quick'] else
                    f'a run with other {", ".join(k for k in settings if saved.get(k) != settings[k])}')
            fail(f'--work-dir {work_dir} holds {what} (see its {RECORD}): give another --work-dir, '
                 f'or delete it to start over')
        return
    if osp.isdir(work_dir) and os.listdir(work_dir):
        fail(f'--work-dir {work_dir} is not empty and holds no run of the demo (no {RECORD}: '
             f'made by another tool, or by a demo that did not record its runs): give another '
             f'--work-dir, or delete it to start over')
    os.makedirs(work_dir, exist_ok=True)
    with open(record, 'w') as f:
        json.dump(settings, f, indent=1)


def check_data_root(data_root: str, synthetic: dict) -> None:
    """The data root holds this synthetic set, or nothing yet: another set (the full demo's, a
    --quick one) or other data must not be deleted to make room."""
    from redet_plugin.datasets.synthetic import read_synthetic_params, synthetic_params
    saved, wanted = read_synthetic_params(data_root), synthetic_params(**synthetic)
    if saved is not None and saved != wanted:
        fail(f'--data-root {data_root} holds a synthetic set made with {saved}, this run needs '
             f'{wanted}: give another --data-root, or delete it to generate this one')
    if saved is None and osp.isdir(data_root) and os.listdir(data_root):
        fail(f'--data-root {data_root} is not empty and holds no synthetic set '
             f'(no synthetic_meta.json): give another --data-root, or delete it')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument('--work-dir', help='default: work_dirs/demo (--quick: work_dirs/demo_quick)')
    parser.add_argument('--data-root',
                        help='default: data/synthetic_dota (--quick: data/synthetic_dota_quick)')
    parser.add_argument('--quick', action='store_true',
                        help='a few small images and iterations: checks the path, not the mAP')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='passed on to tools/train.py and tools/test.py')
    args = parser.parse_args(argv)
    default_work_dir, default_data_root = default_dirs(args.quick)
    data_root = osp.abspath(args.data_root or default_data_root) + '/'
    work_dir = osp.abspath(args.work_dir or default_work_dir)

    from mmengine.config import Config
    from redet_plugin.datasets.synthetic import ensure_synthetic_dota
    synthetic = Config.fromfile(args.config).train_dataloader.dataset.get('synthetic')
    if synthetic is None:
        sys.exit(f'error: {args.config} does not train on the synthetic set '
                 f'(train_dataloader.dataset.synthetic is not set)')
    synthetic = dict(synthetic)
    if args.quick:
        synthetic.update(num_train=4, num_val=2, image_size=96)
    synthetic.pop('progress', None)
    check_data_root(data_root, synthetic)
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options.append(f'{loader}.dataset.data_root={data_root}')
        options += [f'{loader}.dataset.synthetic.{k}={v}' for k, v in synthetic.items()
                    if k in ('num_train', 'num_val', 'image_size', 'seed')]
        if args.quick:
            options += [f'{loader}.num_workers=0', f'{loader}.persistent_workers=False']
    if args.quick:
        options += ['train_cfg.max_epochs=1', 'train_cfg.val_interval=1']
    options += args.cfg_options
    claim_work_dir(work_dir, dict(quick=args.quick, config=osp.abspath(args.config),
                                  cfg_options=options))
    # the config's SyntheticDOTADataset would make it on first use too; with the same parameters
    if ensure_synthetic_dota(data_root, progress=not args.quick, **synthetic) is None:
        print(f'synthetic data set already in {data_root}')

    start = time.time()
    run('train', ['tools/train.py', args.config, '--work-dir', work_dir, '--resume', 'auto',
                  '--cfg-options'] + options)
    train_minutes = (time.time() - start) / 60
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    run('test', ['tools/test.py', args.config, checkpoint, '--work-dir', work_dir,
                 '--show-dir', osp.join(work_dir, 'pictures'),
                 '--out', osp.join(work_dir, 'results.pkl'), '--cfg-options'] + options)
    run('plot', ['tools/analysis_tools/plot_curves.py', work_dir, '--out',
                 osp.join(work_dir, 'curves.png')])
    with open(osp.join(work_dir, 'test_metrics.json')) as f:
        metrics = json.load(f)
    print(f'\nmAP@0.5 on the synthetic val split: {metrics["dota/mAP"]:.4f} '
          f'(training took {train_minutes:.1f} min, this run)')
    print(f'pictures: {osp.join(work_dir, "pictures")}  curves: '
          f'{osp.join(work_dir, "curves.png")}')
    return metrics


if __name__ == '__main__':
    main()
