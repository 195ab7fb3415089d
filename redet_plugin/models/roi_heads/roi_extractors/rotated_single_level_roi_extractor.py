"""RotatedSingleRoIExtractor: pools rotated RoIs from the FPN level that fits their size.

rois are (K, 6) = (batch_idx, cx, cy, w, h, theta) in image coordinates. Each RoI goes to level
floor(log2(sqrt(w*h) / finest_scale)), clamped to the available levels (mmrotate's rule), and is
pooled there by `roi_layer` (any of ours registered in mmdet's MODELS, or an mmcv.ops class).

Two ways to pool, same result:
- per level (any layer): mmdet's loop of masks, nonzero and index_put; a level without RoIs
  adds a zero-weighted term so that DDP still sees gradients for every input.
- fused (layers that have a multi-level kernel, e.g. our RiRoIAlignRotated): one launch pools
  every RoI from its own level; no host synchronisation (the op's check of the rois' values is
  skipped: ops.unchecked_rois), no gather/scatter copies. Its backward
  returns a gradient (zeros) for every level, RoIs or not, so DDP needs no extra term
  (tests/test_models/test_rotated_roi_extractor.py checks every upstream parameter gets one).
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
from mmdet.registry import MODELS
from mmdet.models.roi_heads.roi_extractors.base_roi_extractor import BaseRoIExtractor
from torch import Tensor, nn

from redet_plugin.models.utils.device_constants import constant
from redet_plugin.ops import unchecked_rois
from redet_plugin.utils.registration import register

from .roi_layer_builder import build_roi_layers, pooled_size, readable_by
from .fused_kernels import fused_kernel_for


@register(MODELS)
class RotatedSingleRoIExtractor(BaseRoIExtractor):
    """Args:
        roi_layer (dict): RoI layer config, e.g. dict(type='RedetRiRoIAlignRotated', output_size=7,
            num_samples=2, num_orientations=8, clockwise=True); `spatial_scale` is set per level.
        out_channels (int): channels of the pooled features (= channels of every input level).
        featmap_strides (list[int]): stride of each input level w.r.t. the image.
        finest_scale (float): RoIs with sqrt(w*h) < 2 * finest_scale go to level 0. Default 56.
        fused (bool, optional): pool all levels in one launch. None (default) = fused when the
            layer has a multi-level kernel; True with a layer that has none is an error.
        init_cfg (dict, optional): mmengine init config.
    """

    def __init__(self, roi_layer: dict, out_channels: int, featmap_strides: Sequence[int],
                 finest_scale: float = 56, fused: Optional[bool] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(roi_layer=roi_layer, out_channels=out_channels,
                         featmap_strides=list(featmap_strides), init_cfg=init_cfg)
        if not float(finest_scale) > 0:
            raise ValueError(f"finest_scale: expected a positive number, got {finest_scale!r}")
        self.finest_scale = float(finest_scale)
        self.fused_kernel = fused_kernel_for(self.roi_layers[0])
        if fused and self.fused_kernel is None:
            raise ValueError(f"fused=True: {type(self.roi_layers[0]).__name__} has no multi-level "
                             "kernel; use fused=None or False")
        self.fused = self.fused_kernel is not None if fused is None else bool(fused)

    def build_roi_layers(self, layer_cfg: dict, featmap_strides: List[int]) -> nn.ModuleList:
        return build_roi_layers(layer_cfg, featmap_strides)

    def map_roi_levels(self, rois: Tensor, num_levels: int) -> Tensor:
        """Level of each RoI from its scale sqrt(w*h): < 2*finest_scale -> 0, < 4* -> 1, ...,
        clamped to num_levels - 1; a negative w*h counts as 0.

        mmdet's rule floor(log2(scale / finest_scale + 1e-6)) written as a search of w*h among
        the level thresholds (finest_scale * (2^l - 1e-6))^2: two kernels instead of nine.
        """
        w, h = rois[:, 3], rois[:, 4]
        if w.element_size() < 4:  # fp16 w*h overflows beyond sqrt(65504) = 256 px
            w = w.float()  # (h is promoted inside the product: one cast, not two)
        area = w * h
        return torch.bucketize(area, self._level_thresholds(num_levels, area), right=True)

    def _level_thresholds(self, num_levels: int, area: Tensor) -> Tensor:
        return constant([(self.finest_scale * (2.0 ** level - 1e-6)) ** 2
                         for level in range(1, num_levels)], area.dtype, area.device)

    def roi_rescale(self, rois: Tensor, scale_factor: Union[float, Tuple[float, float]]) -> Tensor:
        """Scales w and h about the centre; a number, or (h_scale, w_scale) as in mmrotate."""
        if isinstance(scale_factor, (tuple, list)):
            if len(scale_factor) != 2:
                raise ValueError("roi_scale_factor: expected a number or (h_scale, w_scale), got "
                                 f"{scale_factor!r}")
            h_scale, w_scale = scale_factor
        else:
            h_scale = w_scale = scale_factor
        scaled = rois.clone()  # (no new_tensor: a host-to-device copy would synchronise)
        scaled[:, 3] *= float(w_scale)
        scaled[:, 4] *= float(h_scale)
        return scaled

    def forward(self, feats: Sequence[Tensor], rois: Tensor,
                roi_scale_factor: Optional[Union[float, Tuple[float, float]]] = None) -> Tensor:
        """feats: per-level (N, out_channels, H_l, W_l); rois (K, 6) -> (K, out_channels, h, w)."""
        feats = self._checked_feats(feats)
        if not isinstance(rois, Tensor) or rois.dim() != 2 or rois.size(1) != 6:
            raise ValueError("rois: expected a (K, 6) tensor (batch_idx, cx, cy, w, h, theta), got "
                             f"{tuple(rois.shape) if isinstance(rois, Tensor) else type(rois)}")
        levels = self.map_roi_levels(rois, len(feats))
        rois = rois.type_as(feats[0])  # the ops take rois in the features' dtype (amp: fp16)
        if roi_scale_factor is not None:
            rois = self.roi_rescale(rois, roi_scale_factor)
        # rois from bbox2roi need no value check, and skipping it spares a host wait per call
        with unchecked_rois():
            if self.fused:
                return self.fused_kernel(self.roi_layers[:len(feats)], feats, rois, levels)
            return self._pool_per_level(feats, rois, levels)

    def _checked_feats(self, feats: Sequence[Tensor]) -> List[Tensor]:
        feats = list(feats)
        if not 1 <= len(feats) <= self.num_inputs:
            raise ValueError(f"feats: expected 1 to {self.num_inputs} feature levels (one per "
                             f"featmap_stride), got {len(feats)}")
        for i, feat in enumerate(feats):
            if feat.dim() != 4 or feat.size(1) != self.out_channels:
                raise ValueError(f"feats[{i}]: expected (N, out_channels={self.out_channels}, H, "
                                 f"W), got {tuple(feat.shape)}")
        return feats

    def _pool_per_level(self, feats: List[Tensor], rois: Tensor, levels: Tensor) -> Tensor:
        out = feats[0].new_zeros(rois.size(0), self.out_channels, *pooled_size(self.roi_layers[0]))
        for i, (feat, layer) in enumerate(zip(feats, self.roi_layers)):
            inds = torch.nonzero(levels == i).squeeze(1)
            # (torch.export cannot branch on the count, which depends on the data: an exported
            # program pools and writes every level, the empty ones included)
            if torch.compiler.is_exporting() or inds.numel() > 0:
                out[inds] = layer(readable_by(layer, feat), rois[inds])
            else:
                # An unused level must stay in the graph: DDP expects the same set of gradients on
                # every rank and hangs otherwise. One element of it, times zero, is enough.
                out = out + self._zero_weighted(feat)
        return out

    def _zero_weighted(self, feat: Tensor) -> Tensor:
        term = feat.flatten()[:1].sum() * 0.0
        for param in self.parameters():
            term = term + param.flatten()[:1].sum() * 0.0
        return term
