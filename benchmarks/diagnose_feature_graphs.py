"""Does `cuda_graph_features` replay, and what does a step cost with and without it?

On the R50 synthetic config (benchmarks/profile_detector.py's set-up), for graphs on and off:
the median uninstrumented training step (batch 2) and test image, the median backbone + neck call
alone (extract_feat, no grad), how many captures ran and how long they took, the longest kernels
of one extract_feat call, and with graphs the host ops that took the most CPU time in one test
image and training step (torch.profiler) and each backbone part and the neck timed eagerly and
as its own graph (parts_graph_vs_eager). It found the host time FeatureGraphs spent choosing a
graph (docs/detector.md, "CUDA graphs for backbone + neck").

    python -m benchmarks.diagnose_feature_graphs --out diag.json [--checkpoint CKPT]
(from the repository root, on a CUDA machine)
"""
import argparse
import itertools
import json
import statistics
import time

import torch

from benchmarks import profile_detector as pd
from redet_plugin.cuda_graphs import FeatureGraphs


def timed_ms(fn, count):
    times = []
    for _ in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 3), [round(t, 1) for t in times]


def count_captures(graphs):
    """Wraps graphs._capture to record each capture's time."""
    record = []
    original = graphs._capture

    def capture(*args, **kwargs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = original(*args, **kwargs)
        torch.cuda.synchronize()
        record.append(round(1000 * (time.perf_counter() - start), 1))
        return out
    graphs._capture = capture
    return record


def top_host_ops(fn, count=20):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:count]
    return {e.key[:80]: dict(self_ms=round(e.self_cpu_time_total / 1000, 3), calls=e.count)
            for e in events}


def graph_vs_eager_ms(fn, x, count=8):
    """Median ms of fn(x) eagerly and as a replayed forward graph (no grad)."""
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(static)
    return dict(eager_ms=timed_ms(lambda: fn(x), count)[0],
                graph_ms=timed_ms(graph.replay, count)[0])


def parts_graph_vs_eager(model, x):
    """Each backbone part and the neck, eagerly and as its own graph (no grad, eval)."""
    from e2cnn import nn as enn
    backbone, rows = model.backbone, {}
    with torch.no_grad():
        gt = backbone.wrap_input(x, backbone.in_type, 'x')
        stem = lambda t: backbone.maxpool(backbone.relu(backbone.bn1(backbone.conv1(
            enn.GeometricTensor(t, backbone.in_type))))).tensor
        rows['stem'] = graph_vs_eager_ms(stem, gt.tensor)
        gt = enn.GeometricTensor(stem(gt.tensor), backbone.maxpool.out_type)
        for name in backbone.layer_names:
            layer = getattr(backbone, name)
            run = lambda t, layer=layer, in_type=gt.type: layer(enn.GeometricTensor(t, in_type)).tensor
            rows[name] = graph_vs_eager_ms(run, gt.tensor)
            gt = layer(gt)
        feats = backbone(x)
        rows['neck'] = graph_vs_eager_ms(lambda t: model.neck(
            tuple(f if i else t for i, f in enumerate(feats))), feats[0])
        conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda()
        rows['plain conv2d 256x256x3x3 on 1x256x256x256'] = graph_vs_eager_ms(
            conv, torch.randn(1, 256, 256, 256, device='cuda'))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True)
    p.add_argument('--checkpoint')
    p.add_argument('--steps', type=int, default=8)
    args = p.parse_args(argv)
    prof_args = pd.parse_args(['--out', '/dev/null', '--eager', '--resize', '1024']
                              + (['--checkpoint', args.checkpoint] if args.checkpoint else []))
    cfg, model, optim_wrapper, loaders = pd.build(prof_args)
    train_batches, _ = pd.load_batches(loaders['train'], 3)
    test_batches, _ = pd.load_batches(loaders['val'], 3)
    x_test = model.data_preprocessor(test_batches[0], False)['inputs']
    result = dict(x_test=dict(shape=list(x_test.shape), dtype=str(x_test.dtype),
                              contiguous=x_test.is_contiguous(), requires_grad=x_test.requires_grad))
    for mode in ('graphs', 'eager'):
        graphs = FeatureGraphs() if mode == 'graphs' else None
        captures = count_captures(graphs) if graphs is not None else []
        model.feature_graphs = graphs
        model.train()
        step = itertools.count()  # (cycles through the loaded batches)
        train = timed_ms(lambda: pd.plain_train_step(
            model, train_batches[next(step) % 3], optim_wrapper), args.steps)
        train_captures = list(captures)
        model.eval()
        test = timed_ms(lambda: pd.plain_test_image(
            model, test_batches[next(step) % 3], prof_args), args.steps)
        with torch.no_grad():
            feat = timed_ms(lambda: model.extract_feat(x_test), args.steps)
        row = dict(train_step_ms=train, test_image_ms=test, extract_feat_no_grad_ms=feat)
        if graphs is not None:
            row.update(train_captures_ms=train_captures,
                       test_captures_ms=captures[len(train_captures):], graphs_kept=len(graphs))
            row['host_ops_test'] = top_host_ops(lambda: pd.plain_test_image(
                model, test_batches[0], prof_args))
            model.train()
            row['host_ops_train'] = top_host_ops(lambda: pd.plain_train_step(
                model, train_batches[0], optim_wrapper))
            row['captures_total'] = len(captures)
        if graphs is not None:
            model.eval()
            row['kernels_graph_extract_feat'] = pd.top_kernels(
                lambda: torch.no_grad()(model.extract_feat)(x_test), count=12)
            row['parts_graph_vs_eager'] = parts_graph_vs_eager(model, x_test)
        else:
            row['kernels_eager_extract_feat'] = pd.top_kernels(
                lambda: torch.no_grad()(model.extract_feat)(x_test), count=12)
        row['cudnn'] = dict(benchmark=torch.backends.cudnn.benchmark,
                            allow_tf32=torch.backends.cudnn.allow_tf32,
                            matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
        result[mode] = row
        print(mode, json.dumps({k: v for k, v in row.items() if not k.startswith('host')}, indent=1))
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
