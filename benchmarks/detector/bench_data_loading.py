"""How fast a data loader of a config delivers batches, by number of worker processes.

The R50 ReDet step on one GPU takes tens of milliseconds, while one process loads and augments a
batch of two 1024² images in several times that (benchmarks/profiling/profile_detector.py): the
loader's workers must keep up, or the GPU waits for data; at test time (one image a batch) the
model's step is shorter still. This times the config's own --loader (its dataset, pipeline, sampler
and collate) at each --workers count: batches per second over --batches batches, after each worker
has delivered its first (start-up is left out).

    python -m benchmarks.detector.bench_data_loading --out data_loading.json [--workers 0 2 4 8]
        [--loader train_dataloader | val_dataloader | test_dataloader]
(from the repository root; data:
 python tools/dataset_converters/make_synthetic_dota.py DIR --image-size 1024)
"""
import argparse
import json
import os
import os.path as osp
import time

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file for the results')
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--data-root', default=osp.join(REPO, 'data', 'synthetic_dota_1024'),
                   help="the loader's data_root (DOTA format: train/, val/)")
    p.add_argument('--loader', default='train_dataloader',
                   choices=('train_dataloader', 'val_dataloader', 'test_dataloader'))
    p.add_argument('--workers', type=int, nargs='+', default=[0, 2, 4, 8])
    p.add_argument('--batches', type=int, default=40, help='timed batches per worker count')
    args = p.parse_args(argv)
    if args.batches < 1:
        p.error(f'--batches: expected at least 1, got {args.batches}')
    if min(args.workers) < 0:
        p.error(f'--workers: expected counts >= 0, got {args.workers}')
    if not osp.isdir(args.data_root):
        p.error(f'--data-root: {args.data_root!r} is not a folder (make one with '
                'python tools/dataset_converters/make_synthetic_dota.py DIR --image-size 1024)')
    return args


def loader(cfg, name, data_root, workers):
    from mmengine.runner import Runner
    loader_cfg = cfg[name].copy()
    loader_cfg.update(num_workers=workers, persistent_workers=workers > 0)
    loader_cfg['dataset'].update(data_root=osp.abspath(data_root) + '/')
    return Runner.build_dataloader(loader_cfg)


def batches_per_second(data_loader, workers, count):
    """Batches per second once every worker has delivered one batch; the loader is cycled."""
    it = iter(data_loader)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(data_loader)
            return next(it)

    for _ in range(max(1, workers)):
        next_batch()
    start = time.perf_counter()
    for _ in range(count):
        next_batch()
    return count / (time.perf_counter() - start)


def main(argv=None):
    args = parse_args(argv)
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    rows = []
    for workers in args.workers:
        rate = batches_per_second(loader(cfg, args.loader, args.data_root, workers), workers,
                                  args.batches)
        rows.append(dict(workers=workers, batches_per_s=round(rate, 2),
                         ms_per_batch=round(1000 / rate, 1)))
        print(f'workers {workers}: {rate:.2f} batches/s ({1000 / rate:.1f} ms per batch)')
    import torch
    environment = dict(device=f'{os.cpu_count()} CPU cores (the loader runs on the CPU)',
                       torch=torch.__version__)
    result = dict(environment=environment, config=osp.relpath(args.config, REPO),
                  loader=args.loader, batch_size=cfg[args.loader].batch_size,
                  config_workers=cfg[args.loader].num_workers, cpu_count=os.cpu_count(),
                  batches=args.batches, runs=rows)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
