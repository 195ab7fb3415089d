"""tools/test.py end to end on one mmrotate checkpoint and the same images: ours (the
mmrotate-compatible config) against mmrotate's own test.py, read from the two runs' logs.

benchmarks/detector/mmrotate_parity.sh runs both tests and then this. Each side's s / image is the
median of its logged windows after the first (the warm-up), as bench_detector_vs_mmrotate reads
a test; the model's s / image leaves out mmengine's data_time (the wait for the loader).

    python -m benchmarks.detector.same_checkpoint_test --ours OUR_WORK_DIR
        --mmrotate THEIR_WORK_DIR --checkpoint CKPT --out F
"""
import argparse
import json
import sys

import torch

from benchmarks.detector.bench_detector_vs_mmrotate import environment, test_summary

KEYS = ('s_per_image', 'model_s_per_image', 'mAP50', 'logged_windows')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--ours', required=True, help="our tools/test.py's --work-dir")
    p.add_argument('--mmrotate', required=True, help="mmrotate's tools/test.py's --work-dir")
    p.add_argument('--checkpoint', required=True, help='the checkpoint both tested')
    p.add_argument('--out', required=True, help='JSON file')
    return p.parse_args(argv)


def ratio(theirs, ours):
    return round(theirs / ours, 2) if theirs and ours else None


def main(argv=None):
    args = parse_args(argv)
    runs = {}
    for name, work_dir in (('mmrotate', args.mmrotate), ('ours', args.ours)):
        summary = test_summary(work_dir)
        if not summary['logged_windows']:
            sys.exit(f'same_checkpoint_test: no test log with logged windows under {work_dir}')
        runs[name] = {key: summary[key] for key in KEYS}
    ours, theirs = runs['ours'], runs['mmrotate']
    result = dict(
        what=__doc__.splitlines()[0],
        command=' '.join(['python -m benchmarks.detector.same_checkpoint_test']
                         + (argv if argv is not None else sys.argv[1:])),
        checkpoint=args.checkpoint, environment=environment(torch.cuda.device_count()), runs=runs,
        test_speedup=ratio(theirs['s_per_image'], ours['s_per_image']),
        model_speedup=ratio(theirs['model_s_per_image'], ours['model_s_per_image']),
        mAP_minus_mmrotate=round(ours['mAP50'] - theirs['mAP50'], 4)
        if ours['mAP50'] is not None and theirs['mAP50'] is not None else None)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(f"tools/test.py on one checkpoint: ours {ours['s_per_image']} s / image, mmrotate "
          f"{theirs['s_per_image']} ({result['test_speedup']}x); model alone "
          f"{result['model_speedup']}x; mAP {ours['mAP50']} against {theirs['mAP50']}")
    return result


if __name__ == '__main__':
    main()
