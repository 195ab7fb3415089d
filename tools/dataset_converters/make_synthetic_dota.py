"""Writes a synthetic data set in the layout of DOTA (default), HRSC2016 or DIOR-R.

  dota: root/{train,val}/{images,labelTxt}                      (--num-train, --num-val images)
  hrsc: root/ImageSets/{trainval,test}.txt, root/FullDataSet/{AllImages,Annotations}
                                                                 (--num-train trainval, --num-val test)
  dior: root/ImageSets/Main/{train,val,trainval,test}.txt, root/JPEGImages-{trainval,test},
        root/Annotations/Oriented Bounding Boxes                 (--num-train trainval, --num-val test)

Example: python tools/dataset_converters/make_synthetic_dota.py data/synthetic_dota --num-train 400 --num-val 100
         python tools/dataset_converters/make_synthetic_dota.py data/synthetic_hrsc --layout hrsc
"""
import argparse

from redet_plugin.datasets import (SYNTHETIC_CLASSES, SYNTHETIC_DIOR_CLASSES, generate_synthetic_dior,
                                   generate_synthetic_dota, generate_synthetic_hrsc)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('root', help='output folder')
    parser.add_argument('--layout', choices=('dota', 'hrsc', 'dior'), default='dota')
    parser.add_argument('--num-train', type=int, default=400, help='train (dota) or trainval images')
    parser.add_argument('--num-val', type=int, default=100, help='val (dota) or test images')
    parser.add_argument('--image-size', type=int, default=256)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--classes', nargs='+', default=None,
                        help=f'dota: some of {list(SYNTHETIC_CLASSES)} (all by default); dior: some of '
                             f'{list(SYNTHETIC_DIOR_CLASSES)}; hrsc: ships only, not taken')
    return parser.parse_args()


def main():
    args = parse_args()
    table = {'dota': SYNTHETIC_CLASSES, 'dior': SYNTHETIC_DIOR_CLASSES, 'hrsc': None}[args.layout]
    if args.classes is not None and (table is None or not set(args.classes) <= set(table)):
        allowed = 'none (every object is a ship)' if table is None else list(table)
        raise SystemExit(f'--classes for --layout {args.layout}: {allowed}, got {args.classes}')
    counts = (args.root, args.num_train, args.num_val, args.image_size, args.seed)
    if args.layout == 'dota':
        params = generate_synthetic_dota(*counts, args.classes or SYNTHETIC_CLASSES)
    elif args.layout == 'hrsc':
        params = generate_synthetic_hrsc(*counts)
    else:
        params = generate_synthetic_dior(*counts, args.classes or SYNTHETIC_DIOR_CLASSES)
    print(f'wrote {params} to {args.root}')


if __name__ == '__main__':
    main()
