"""Every place where a training step or a test forward of the ReDet detector makes the host wait
for the GPU, with the Python stack that asked for it.

redet_plugin.testing.record_host_syncs records each synchronising CUDA call with its Python stack,
grouped by the innermost frame of the project, mmdet, mmcv or mmengine. A step whose list is
empty never waits on the host.
The steps are run as users run them: model.train_step(batch, optim_wrapper) as mmengine's train
loop calls it, and model.test_step(batch).

    python -m benchmarks.profiling.list_host_syncs --out host_syncs.json [--checkpoint CKPT]
(from the repository root, on a GPU; data as for benchmarks.profiling.profile_detector)
"""
import argparse
import json
import os.path as osp

import torch

from benchmarks.profiling.profile_detector import REPO, build, load_batches, queued_logs
from redet_plugin.testing import record_host_syncs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='JSON file')
    p.add_argument('--config', default=osp.join(
        REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'))
    p.add_argument('--data-root', default=osp.join(REPO, 'data', 'synthetic_dota_1024'))
    p.add_argument('--checkpoint', help='trained weights (else random)')
    p.add_argument('--resize', type=int, help="Resize scale (default: the config's)")
    p.add_argument('--amp', action='store_true')
    p.add_argument('--eager', action='store_true', help='no CUDA graphs (model.cuda_graphs=False)')
    p.add_argument('--captured', action='store_true',
                   help='the steps as whole CUDA graphs (model.cuda_graph_step, every batch '
                        'padded to 256 gts, and model.cuda_graph_predict): the recorded steps '
                        'are replays')
    p.add_argument('--channels-last', action=argparse.BooleanOptionalAction,
                   help="model.channels_last (default: the config's)")
    p.add_argument('--warmup', type=int, default=2, help='steps run before the recorded one')
    args = p.parse_args(argv)
    args.device = 'cuda'
    if not torch.cuda.is_available():
        p.error('needs a CUDA device: host synchronisations exist only on one')
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg, model, optim_wrapper, loaders = build(args)
    train_batches, _ = load_batches(loaders['train'], args.warmup + 1)
    test_batches, _ = load_batches(loaders['val'], args.warmup + 1)
    with queued_logs():
        for batch in train_batches[:-1]:
            model.train_step(batch, optim_wrapper)
        train = record_host_syncs(lambda: model.train_step(train_batches[-1], optim_wrapper))
    model.eval()
    with torch.no_grad():
        for batch in test_batches[:-1]:
            model.test_step(batch)
        test = record_host_syncs(lambda: model.test_step(test_batches[-1]))
    environment = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       cuda=torch.version.cuda)
    result = dict(environment=environment, config=osp.relpath(args.config, REPO), amp=args.amp,
                  cuda_graph_features=bool(cfg.model.get('cuda_graph_features', False)),
                  captured=args.captured,
                  train_step=dict(syncs=sum(s['count'] for s in train), sites=train),
                  test_step=dict(syncs=sum(s['count'] for s in test), sites=test))
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    for step in ('train_step', 'test_step'):
        print(f"{step}: {result[step]['syncs']} host synchronisations at "
              f"{len(result[step]['sites'])} call sites")
        for s in result[step]['sites'][:25]:
            print(f"  {s['count']:4d}  {s['site']}")


if __name__ == '__main__':
    main()
