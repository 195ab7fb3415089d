"""Summarise one training run from mmengine's vis_data/scalars.json: median iteration and
data-wait time, images/s, peak memory, first/last loss. Used by
benchmarks/detector/bench_detector_vs_mmrotate.py.

    python -m benchmarks.detector.summarize_training WORK_DIR --batch-size 2 [--skip 20] --out run.json
    (repo root; or with the repo root on PYTHONPATH)
"""
import argparse
import json
import statistics
from pathlib import Path

from tools.analysis_tools.plot_curves import find_scalar_files, read_records


def summarize(work_dir: str, batch_size: int, skip: int) -> dict:
    train, val = read_records(find_scalar_files(work_dir))
    steady = [r for r in train if r['step'] > skip] or train
    time_s = statistics.median(r['time'] for r in steady)
    return {
        'work_dir': work_dir,
        'iterations': max(r['step'] for r in train),
        'median_iter_time_s': time_s,
        'images_per_s': batch_size / time_s,
        # the part of each iteration spent waiting for the data loader
        'median_data_time_s': statistics.median(r.get('data_time', float('nan')) for r in steady),
        'peak_memory_mb': max(r.get('memory', 0) for r in train),
        'loss_first_logged': train[0]['loss'],
        'loss_last_logged': train[-1]['loss'],
        'loss_curve': [(r['step'], round(r['loss'], 4)) for r in train],
        'val': val,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('work_dir')
    parser.add_argument('--batch-size', type=int, required=True)
    parser.add_argument('--skip', type=int, default=20, help='warm-up iterations left out of the time')
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    result = summarize(args.work_dir, args.batch_size, args.skip)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print({k: v for k, v in result.items() if k not in ('loss_curve', 'val')})


if __name__ == '__main__':
    main()
