"""Draws the ground truth of a data set (after its training pipeline) as rotated polygons, PNG files.

Examples:
  python tools/analysis_tools/browse_dataset.py configs/redet/<config>.py --output-dir work_dirs/browse --max 20
  python tools/analysis_tools/browse_dataset.py --dota data/synthetic_dota/train --output-dir work_dirs/browse
The second form reads a DOTA folder (images/ + labelTxt/) directly, without a pipeline.
"""
import argparse
import os
import os.path as osp

import cv2
import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.config import DictAction
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers datasets, transforms, visualizer)
from redet_plugin.datasets import DOTA_V1_CLASSES, SYNTHETIC_CLASSES, DOTADataset
from redet_plugin.visualization import RotatedDetLocalVisualizer


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', nargs='?', help='config file (its train_dataloader.dataset is drawn)')
    parser.add_argument('--dota', help='a DOTA folder with images/ and labelTxt/ (instead of a config)')
    parser.add_argument('--classes', nargs='+', help='class names for --dota (default: DOTA-v1.0, '
                        'or the synthetic classes when the folder holds the synthetic data set)')
    parser.add_argument('--output-dir', required=True)
    parser.add_argument('--max', type=int, default=50, help='number of images to draw')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='key=value overrides of the config')
    args = parser.parse_args()
    if (args.config is None) == (args.dota is None):
        parser.error('give either a config or --dota FOLDER')
    return args


def browse_config(args):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS, VISUALIZERS
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    vis_cfg = cfg.get('visualizer', dict(type='RedetRotatedDetLocalVisualizer'))
    if vis_cfg.get('type') in ('DetLocalVisualizer', 'mmdet.DetLocalVisualizer'):
        vis_cfg['type'] = 'RedetRotatedDetLocalVisualizer'
    vis_cfg = dict(vis_cfg, name='browse_dataset', save_dir=None, vis_backends=None)
    visualizer = VISUALIZERS.build(vis_cfg)
    visualizer.dataset_meta = dataset.metainfo
    for index in range(min(args.max, len(dataset))):
        item = dataset[index]
        image = item['inputs'].permute(1, 2, 0).numpy()[..., ::-1]  # BGR tensor -> RGB
        sample = item['data_samples']
        out_file = osp.join(args.output_dir, osp.basename(sample.img_path).rsplit('.', 1)[0] + '.png')
        visualizer.add_datasample('gt', image, sample, draw_pred=False, show=False, out_file=out_file)


def browse_dota(args):
    classes = args.classes
    if classes is None:
        synthetic = osp.isfile(osp.join(osp.dirname(osp.normpath(args.dota)), 'synthetic_meta.json'))
        classes = SYNTHETIC_CLASSES if synthetic else DOTA_V1_CLASSES
    dataset = DOTADataset(data_root=args.dota, ann_file='labelTxt', data_prefix=dict(img_path='images'),
                          metainfo=dict(classes=tuple(classes)), pipeline=[], on_bad_line='warn')
    visualizer = RotatedDetLocalVisualizer(name='browse_dota')
    visualizer.dataset_meta = dataset.metainfo
    for index in range(min(args.max, len(dataset))):
        info = dataset.get_data_info(index)
        image = cv2.imread(info['img_path'])[..., ::-1]  # BGR -> RGB
        instances = info['instances']
        sample = DetDataSample()
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([i['bbox'] for i in instances], dtype=torch.float32).reshape(-1, 5),
            labels=torch.tensor([i['bbox_label'] for i in instances], dtype=torch.int64))
        visualizer.add_datasample('gt', np.ascontiguousarray(image), sample, draw_pred=False,
                                  out_file=osp.join(args.output_dir, info['img_id'] + '.png'))


def main():
    args = parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    browse_config(args) if args.config else browse_dota(args)
    print(f'pictures written to {args.output_dir}')


if __name__ == '__main__':
    main()
