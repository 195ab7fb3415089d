"""Writes the synthetic DOTA-format data set (root/{train,val}/{images,labelTxt}).

Example: python tools/data/make_synthetic_dota.py data/synthetic_dota --num-train 400 --num-val 100
"""
import argparse

from redet_plugin.datasets import SYNTHETIC_CLASSES, generate_synthetic_dota


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help='output folder')
    parser.add_argument('--num-train', type=int, default=400)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--image-size', type=int, default=256)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--classes', nargs='+', default=list(SYNTHETIC_CLASSES), choices=SYNTHETIC_CLASSES)
    return parser.parse_args()


def main():
    args = parse_args()
    params = generate_synthetic_dota(args.root, args.num_train, args.num_val, args.image_size, args.seed,
                                     args.classes)
    print(f'wrote {params} to {args.root}')


if __name__ == '__main__':
    main()
