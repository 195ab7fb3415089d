"""Plot training losses (per iteration) and validation mAP (per epoch) from a training log.

    python tools/analysis_tools/plot_curves.py WORK_DIR_OR_SCALARS_JSON [--out curves.png]
        [--keys loss s1.loss_cls ...] [--metric dota/mAP]

Reads mmengine's `vis_data/scalars.json` (one JSON object per logged step); given a work dir it
takes the runs' files in time order, so a resumed training continues the same curve.

mmdet's tools/analysis_tools/analyze_logs.py (plot_curve) draws the keys named on its command line
from the scalars.json files named there, one curve per file, and needs seaborn (not an mmdet
requirement). This tool adds what the demo and the benchmarks use: a whole work dir read as one
training (a resumed run replaces the records it repeats), every loss by default (both stages'
`s0.`/`s1.` ones), the validation metric per epoch beside the losses in one PNG written without a
display, and one-line errors for a folder without logs or a line that is not JSON.
"""
import argparse
import glob
import json
import os.path as osp
import sys


def find_scalar_files(path: str) -> list:
    if osp.isfile(path):
        return [path]
    files = sorted(glob.glob(osp.join(path, '*', 'vis_data', 'scalars.json')))
    if not files:
        sys.exit(f'error: no */vis_data/scalars.json under {path!r} (is it a training work dir?)')
    return files


def read_records(files: list):
    """(train records, val records); later runs (resumed) replace earlier ones at the same step."""
    train, val = {}, {}
    for name in files:
        with open(name) as f:
            for line_no, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    sys.exit(f'error: {name}:{line_no} is not JSON ({error})')
                target = train if 'iter' in record or 'loss' in record else val
                target[record['step']] = record
    return [train[k] for k in sorted(train)], [val[k] for k in sorted(val)]


def plot(train, val, keys, metric, out):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    keys = keys or [k for k in (train[0] if train else {}) if k.startswith(('loss', 's0.loss',
                                                                            's1.loss'))]
    has_metric = any(metric in r for r in val)
    fig, axes = plt.subplots(1, 2 if has_metric else 1, figsize=(12 if has_metric else 7, 4.5))
    axes = axes if has_metric else [axes]
    steps = [r['step'] for r in train]
    for key in keys:
        axes[0].plot(steps, [r.get(key, float('nan')) for r in train], label=key)
    axes[0].set(xlabel='iteration', ylabel='loss', title='training losses')
    axes[0].legend(fontsize=8)
    if has_metric:
        points = [(r['step'], r[metric]) for r in val if metric in r]
        axes[1].plot(*zip(*points), marker='o')
        axes[1].set(xlabel='epoch', ylabel=metric, title=f'validation {metric}', ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description='Plot loss and mAP curves of a training')
    parser.add_argument('path', help='training work dir, or one scalars.json')
    parser.add_argument('--out', default=None, help='PNG file (default: <path>/curves.png)')
    parser.add_argument('--keys', nargs='+', help='loss keys to plot (default: every loss)')
    parser.add_argument('--metric', default='dota/mAP', help='validation metric to plot')
    args = parser.parse_args(argv)
    train, val = read_records(find_scalar_files(args.path))
    if not train:
        sys.exit(f'error: no training records in {args.path!r}')
    out = args.out or osp.join(args.path if osp.isdir(args.path) else osp.dirname(args.path),
                               'curves.png')
    plot(train, val, args.keys, args.metric, out)
    print(f'wrote {out} ({len(train)} training records, {len(val)} validation records)')
    return out


if __name__ == '__main__':
    main()
