"""Stand-ins for parts other issues deliver (ReResNet/ReFPN, RiRoIAlignRotated, our RoI
extractors), used only while those are not registered yet, so the detector's tests run either way."""
import torch
from mmcv.ops import RoIAlignRotated
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from mmdet.registry import MODELS


@MODELS.register_module(force=True)
class _StandInRotatedRoIExtractor(SingleRoIExtractor):
    """Rotated RoIs (K, 6) -> mmcv RoIAlignRotated on the FPN level that fits their size."""

    def build_roi_layers(self, layer_cfg, featmap_strides):
        return torch.nn.ModuleList(
            RoIAlignRotated(7, 1.0 / s, sampling_ratio=2, clockwise=True) for s in featmap_strides)

    def map_roi_levels(self, rois, num_levels):
        scale = torch.sqrt(rois[:, 3] * rois[:, 4])
        levels = torch.floor(torch.log2(scale / self.finest_scale + 1e-6))
        return levels.clamp(min=0, max=num_levels - 1).long()


def missing_parts():
    return [name for name in ('ReResNet', 'ReFPN', 'HorizontalSingleRoIExtractor',
                              'RotatedSingleRoIExtractor', 'RiRoIAlignRotated')
            if MODELS.get(name) is None]


def with_standins(cfg):
    """Replaces in a config every model part that is not registered yet by a stand-in."""
    model = cfg.model if 'model' in cfg else cfg
    missing = missing_parts()
    if 'ReResNet' in missing:
        width = model.backbone.get('base_channels', 64)
        model.backbone = dict(type='ResNet', depth=model.backbone.depth, base_channels=width,
                              num_stages=4, out_indices=(0, 1, 2, 3), norm_eval=False)
    if 'ReFPN' in missing:
        model.neck = dict(type='FPN', **{k: v for k, v in model.neck.items() if k != 'type'})
    extractors = model.roi_head.bbox_roi_extractor
    if 'HorizontalSingleRoIExtractor' in missing:
        extractors[0] = dict(extractors[0], type='SingleRoIExtractor',
                             roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0))
    if 'RotatedSingleRoIExtractor' in missing:
        extractors[1] = dict(extractors[1], type='_StandInRotatedRoIExtractor')
    elif 'RiRoIAlignRotated' in missing:
        extractors[1] = dict(extractors[1], roi_layer=dict(
            type='RoIAlignRotated', output_size=7, sampling_ratio=2, clockwise=True))
    return cfg
