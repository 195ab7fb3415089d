"""Where a training run's CUDA memory goes, step by step: allocated, reserved and the reserved
peak after each training step of the R50 config (random weights, random 1024^2 images with
random rotated gts), eager or with `cuda_graph_step`. Each setting runs in its own process, as
the allocator reads its settings once.

    python -m benchmarks.profiling.step_memory --out step_memory.json
(from the repository root, on a GPU)
"""
import argparse
import json
import math
import os
import os.path as osp
import subprocess
import sys

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py')
MODES = {  # name: model options (each names every graph option: the configs capture the step)
    'eager': dict(cuda_graph_features=False, cuda_graph_step=False),
    'feature_graphs': dict(cuda_graph_features=True, cuda_graph_step=False),
    'step_graph': dict(cuda_graph_features=False, cuda_graph_step=True),
    'step_graph_one_capacity': dict(cuda_graph_features=False,
                                    cuda_graph_step=dict(min_gt_capacity=128)),
}
ALLOCATORS = {'fixed': None, 'expandable': 'expandable_segments:True'}
GTS = (20, 30, 20, 30, 90, 20, 30, 20)  # gts per image, step by step (90: a second capacity)


def batch(num_gts, seed, size=1024):
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(2):
        sample = DetDataSample(metainfo=dict(
            img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size),
            scale_factor=(1.0, 1.0), batch_input_shape=(size, size)))
        centres = 100 + torch.rand(num_gts, 2, generator=g) * (size - 200)
        sizes = 20 + torch.rand(num_gts, 2, generator=g) * 80
        angles = (torch.rand(num_gts, 1, generator=g) - 0.5) * math.pi
        sample.gt_instances = InstanceData(  # (le90: width >= height)
            bboxes=torch.cat([centres, sizes.max(1, keepdim=True)[0],
                              sizes.min(1, keepdim=True)[0], angles], 1),
            labels=torch.randint(0, 15, (num_gts,), generator=g))
        samples.append(sample)
    images = [torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)
              for _ in range(2)]
    return dict(inputs=images, data_samples=samples)


def run_one(mode):
    """One process: the steps of `mode`, memory after each (MB)."""
    import torch
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(CONFIG)
    cfg.model.update(MODES[mode])
    init_default_scope('mmdet')
    import redet_plugin.mm  # noqa: F401
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.cuda().train()
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    rows = []
    mb = 2 ** 20
    for step, num_gts in enumerate(GTS):
        model.train_step(batch(num_gts, step), wrapper)
        torch.cuda.synchronize()
        rows.append(dict(step=step, gts=num_gts, allocated_mb=torch.cuda.memory_allocated() // mb,
                         reserved_mb=torch.cuda.memory_reserved() // mb,
                         peak_allocated_mb=torch.cuda.max_memory_allocated() // mb,
                         peak_reserved_mb=torch.cuda.max_memory_reserved() // mb))
    graphs = getattr(model, 'step_graphs', None)
    return dict(rows=rows, step_graphs=None if graphs is None else len(graphs),
                failed=None if graphs is None else graphs.failed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True)
    p.add_argument('--modes', nargs='+', choices=list(MODES), default=list(MODES))
    p.add_argument('--allocators', nargs='+', choices=list(ALLOCATORS), default=list(ALLOCATORS))
    p.add_argument('--one', help=argparse.SUPPRESS)  # (the child process: mode)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one)))
        return
    results = {}
    for allocator in args.allocators:
        setting = ALLOCATORS[allocator]
        for mode in args.modes:
            env = {k: v for k, v in os.environ.items() if 'ALLOC_CONF' not in k}
            if setting:
                env['PYTORCH_ALLOC_CONF'] = setting
            done = subprocess.run([sys.executable, '-m', 'benchmarks.profiling.step_memory',
                                   '--out', args.out, '--one', mode], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=300)
            name = f'{mode}/{allocator}'
            try:
                results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                results[name] = dict(error=done.stderr[-2000:])
            last = results[name].get('rows', [{}])[-1]
            print(name, 'peak reserved', last.get('peak_reserved_mb'), 'peak allocated',
                  last.get('peak_allocated_mb'), results[name].get('failed'), flush=True)
    import torch
    environment = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       cuda=torch.version.cuda)
    with open(args.out, 'w') as f:
        json.dump(dict(what=__doc__.splitlines()[0], environment=environment,
                       command=' '.join(['python -m benchmarks.profiling.step_memory']
                                        + (argv if argv is not None else sys.argv[1:])),
                       config=osp.relpath(CONFIG, REPO), gts=GTS, results=results), f, indent=1)


if __name__ == '__main__':
    main()
