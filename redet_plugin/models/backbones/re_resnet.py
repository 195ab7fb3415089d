"""ReResNet: a ResNet whose convolutions are rotation-equivariant (e2cnn, C8, regular fields).

Channel counts are plain channels, as in mmdet's ResNet: a stage with 256 channels has 32 regular
fields of 8 orientations, channel = field * 8 + orientation. The outputs are plain tensors.
"""
from typing import Optional, Sequence

import torch
from e2cnn import nn as enn
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from mmdet.registry import MODELS

from redet_plugin.utils.registration import register

from ..layers.equivariant import (NUM_ORIENTATIONS, EquivariantNetwork, FieldSequential, r2conv,
                           regular_type, to_plain, trivial_type)
from ..layers.field_batch_norm import FieldBatchNorm
from ..layers.fused_convolution import conv_add_relu, conv_relu


class _ReBlock(torch.nn.Module):
    """Base of the residual blocks; their forward runs on GeometricTensors and, once exported, on
    tensors. `fused`: exported with the batch norms folded into the convolutions, each
    convolution runs with its ReLU (and the residual sum) in one call (fused_convolution.py)."""

    expansion = 1
    last_norm_name = ""
    fused = False


class ReBasicBlock(_ReBlock):
    expansion = 1
    last_norm_name = "bn2"

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample=None,
                 style: str = "pytorch", num_orientations: int = NUM_ORIENTATIONS):
        super().__init__()
        in_type = regular_type(in_channels, num_orientations)
        mid_type = regular_type(planes, num_orientations)
        self.conv1 = r2conv(in_type, mid_type, 3, stride=stride, padding=1)
        self.bn1 = FieldBatchNorm(mid_type)
        self.conv2 = r2conv(mid_type, mid_type, 3, padding=1)
        self.bn2 = FieldBatchNorm(mid_type)
        self.relu = enn.ReLU(mid_type, inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        if self.fused:
            return conv_add_relu(self.conv2, conv_relu(self.conv1, x), identity)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ReBottleneck(_ReBlock):
    expansion = 4
    last_norm_name = "bn3"

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample=None,
                 style: str = "pytorch", num_orientations: int = NUM_ORIENTATIONS):
        super().__init__()
        in_type = regular_type(in_channels, num_orientations)
        mid_type = regular_type(planes, num_orientations)
        out_type = regular_type(planes * self.expansion, num_orientations)
        # 'pytorch' style strides in the 3x3 conv, 'caffe' style in the first 1x1 conv
        stride1, stride2 = (1, stride) if style == "pytorch" else (stride, 1)
        self.conv1 = r2conv(in_type, mid_type, 1, stride=stride1)
        self.bn1 = FieldBatchNorm(mid_type)
        self.conv2 = r2conv(mid_type, mid_type, 3, stride=stride2, padding=1)
        self.bn2 = FieldBatchNorm(mid_type)
        self.conv3 = r2conv(mid_type, out_type, 1)
        self.bn3 = FieldBatchNorm(out_type)
        # one ReLU per field type (e2cnn checks types); all are plain ReLUs once exported
        self.relu_mid = enn.ReLU(mid_type, inplace=True)
        self.relu = enn.ReLU(out_type, inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        if self.fused:
            out = conv_relu(self.conv2, conv_relu(self.conv1, x))
            return conv_add_relu(self.conv3, out, identity)
        out = self.relu_mid(self.bn1(self.conv1(x)))
        out = self.relu_mid(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


@register(MODELS)
class ReResNet(EquivariantNetwork, BaseModule):
    """Rotation-equivariant ResNet (ReDet's backbone), mmdet ResNet-style arguments.

    Args:
        depth: 18, 34, 50 or 101.
        in_channels: image channels (scalar fields).
        stem_channels: channels after the 7x7 stem (default: base_channels).
        base_channels: channels of the first stage before expansion (64 for the published model;
            16 gives a narrow model that trains on a CPU). Channel counts must be multiples of
            num_orientations.
        num_stages, strides, out_indices, style, frozen_stages, norm_eval: as in mmdet's ResNet.
            norm_eval defaults to False, as in the published ReDet (mmrotate's ReResNet default).
        zero_init_residual: zero the last norm of each block in init_weights (when not loading a
            checkpoint), as mmdet's ResNet.
        num_orientations: N of the rotation group C_N (8 in ReDet).
        pretrained: deprecated, use init_cfg=dict(type='Pretrained', checkpoint=...).

    Output: a tuple of plain tensors, stage i has base_channels * 2**i * expansion channels
    (expansion 1 for depths 18/34, 4 for 50/101), stride 4 * 2**i.

    `fused` (set by inference/plain_model.py's make_plain on the network and its blocks, once
    exported with the batch norms folded): each convolution runs with its ReLU, and a block's
    last one with the residual sum, in one call (models/layers/fused_convolution.py).
    """

    fused = False
    arch_settings = {
        18: (ReBasicBlock, (2, 2, 2, 2)),
        34: (ReBasicBlock, (3, 4, 6, 3)),
        50: (ReBottleneck, (3, 4, 6, 3)),
        101: (ReBottleneck, (3, 4, 23, 3)),
    }

    def __init__(self,
                 depth: int,
                 in_channels: int = 3,
                 stem_channels: Optional[int] = None,
                 base_channels: int = 64,
                 num_stages: int = 4,
                 strides: Sequence[int] = (1, 2, 2, 2),
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 style: str = "pytorch",
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 zero_init_residual: bool = True,
                 num_orientations: int = NUM_ORIENTATIONS,
                 pretrained: Optional[str] = None,
                 init_cfg=None):
        if pretrained is not None:
            if init_cfg is not None:
                raise ValueError("ReResNet: give either pretrained or init_cfg, not both")
            init_cfg = dict(type="Pretrained", checkpoint=pretrained)
        super().__init__(init_cfg=init_cfg)
        if depth not in self.arch_settings:
            raise KeyError(f"ReResNet: depth must be one of {sorted(self.arch_settings)}; got {depth}")
        if not 1 <= num_stages <= 4:
            raise ValueError(f"ReResNet: num_stages must be in 1..4; got {num_stages}")
        if len(strides) < num_stages:
            raise ValueError(f"ReResNet: strides needs {num_stages} entries; got {tuple(strides)}")
        if not out_indices or max(out_indices) >= num_stages or min(out_indices) < 0:
            raise ValueError(f"ReResNet: out_indices must lie in [0, {num_stages}); got {tuple(out_indices)}")
        if style not in ("pytorch", "caffe"):
            raise ValueError(f"ReResNet: style must be 'pytorch' or 'caffe'; got {style!r}")
        if not -1 <= frozen_stages <= num_stages:
            raise ValueError(f"ReResNet: frozen_stages must be in [-1, {num_stages}]; got {frozen_stages}")
        self.depth = depth
        self.out_indices = tuple(out_indices)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.zero_init_residual = zero_init_residual
        self.num_orientations = num_orientations
        stem_channels = base_channels if stem_channels is None else stem_channels

        self.in_type = trivial_type(in_channels, num_orientations)
        stem_type = regular_type(stem_channels, num_orientations, "stem_channels")
        self.conv1 = r2conv(self.in_type, stem_type, 7, stride=2, padding=3)
        self.bn1 = FieldBatchNorm(stem_type)
        self.relu = enn.ReLU(stem_type, inplace=True)
        self.maxpool = enn.PointwiseMaxPool(stem_type, kernel_size=3, stride=2, padding=1)

        block, stage_blocks = self.arch_settings[depth]
        self.layer_names = []
        self.out_channels = []
        channels = stem_channels
        for i, num_blocks in enumerate(stage_blocks[:num_stages]):
            planes = base_channels * 2 ** i
            layer = self._make_layer(block, channels, planes, num_blocks, strides[i], style)
            channels = planes * block.expansion
            name = f"layer{i + 1}"
            self.add_module(name, layer)
            self.layer_names.append(name)
            self.out_channels.append(channels)
        self.out_channels = [self.out_channels[i] for i in self.out_indices]
        self._freeze_stages()

    def _make_layer(self, block, in_channels, planes, num_blocks, stride, style):
        downsample = None
        out_channels = planes * block.expansion
        if stride != 1 or in_channels != out_channels:
            out_type = regular_type(out_channels, self.num_orientations, "channels")
            downsample = FieldSequential(
                r2conv(regular_type(in_channels, self.num_orientations, "channels"), out_type, 1,
                       stride=stride),
                FieldBatchNorm(out_type))
        blocks = [block(in_channels, planes, stride, downsample, style, self.num_orientations)]
        blocks += [block(out_channels, planes, 1, None, style, self.num_orientations)
                   for _ in range(1, num_blocks)]
        return torch.nn.Sequential(*blocks)

    def forward(self, x):
        x = self.wrap_input(x, self.in_type, "x")
        x = conv_relu(self.conv1, x) if self.fused else self.relu(self.bn1(self.conv1(x)))
        x = self.maxpool(x)
        outs = []
        for i, name in enumerate(self.layer_names):
            x = getattr(self, name)(x)
            if i in self.out_indices:
                outs.append(to_plain(x))
        return tuple(outs)

    def _freeze_stages(self):
        modules = []
        if self.frozen_stages >= 0:
            modules += [self.conv1, self.bn1]
        modules += [getattr(self, f"layer{i}") for i in range(1, self.frozen_stages + 1)]
        for m in modules:
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def init_weights(self):
        super().init_weights()
        loads_checkpoint = isinstance(self.init_cfg, dict) and self.init_cfg.get("type") == "Pretrained"
        if self.zero_init_residual and not loads_checkpoint and not self.exported:
            for m in self.modules():
                if isinstance(m, _ReBlock):
                    for bn in getattr(m, m.last_norm_name).modules():
                        if isinstance(bn, _BatchNorm):
                            torch.nn.init.zeros_(bn.weight)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self
