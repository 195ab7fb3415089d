"""Splits DOTA images into overlapping patches (DOTA devkit rules), e.g. 1024² with gap 200.

Example: python tools/dataset_converters/dota_split.py data/DOTA/train data/split_1024/train --patch-size 1024 --gap 200
Source layout: SRC/images/*.png (+ SRC/labelTxt/*.txt unless a test set). Multi-scale:
--rates 0.5 1.0 1.5. Detections on the patches are merged back by DOTAMetric(merge_patches=True)
or redet_plugin.evaluation.merge_patch_detections.
"""
import argparse

from redet_plugin.datasets import split_dota


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='folder with images/ and labelTxt/')
    parser.add_argument('dst', help='output folder (images/ and labelTxt/ are created)')
    parser.add_argument('--patch-size', type=int, default=1024)
    parser.add_argument('--gap', type=int, default=200)
    parser.add_argument('--rates', type=float, nargs='+', default=[1.0])
    parser.add_argument('--thresh', type=float, default=0.7,
                        help='objects with a smaller fraction inside a patch are dropped')
    parser.add_argument('--img-ext', default='png')
    return parser.parse_args()


def main():
    args = parse_args()
    count = split_dota(args.src, args.dst, args.patch_size, args.gap, args.rates, args.thresh, args.img_ext)
    print(f'wrote {count} patches to {args.dst}')


if __name__ == '__main__':
    main()
