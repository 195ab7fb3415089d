"""ReFPN: mmdet's FPN with rotation-equivariant (e2cnn, C8 regular fields) lateral and output convs.

Nearest upsampling, sums and the extra max-pool levels act on each channel alone, so they keep the
regular fields' equivariance and run on plain tensors.

mmrotate's ReFPN wraps every conv in a ConvModule (`lateral_convs.i.conv.*`, `fpn_convs.i.conv.*`,
its extra convs appended to fpn_convs); its checkpoints load here as they are (a load_state_dict
pre-hook renames them, see `mmrotate_prefixes`).
"""
from typing import List, Sequence, Tuple, Union

import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor, nn

from mmdet.registry import MODELS

from redet_plugin.models.utils.autocast_off import autocast_off
from redet_plugin.utils.registration import register

from ..layers.equivariant import NUM_ORIENTATIONS, EquivariantNetwork, r2conv, regular_type, to_plain


@register(MODELS)
class ReFPN(EquivariantNetwork, BaseModule):
    """Rotation-equivariant FPN, mmdet FPN-style arguments.

    Args:
        in_channels: plain channels of each input level (multiples of num_orientations).
        out_channels: plain channels of every output level (256 = 32 fields x 8 orientations).
        num_outs: output levels; levels beyond the inputs come from max-pooling (stride 2) the last
            output (add_extra_convs=False, as the published ReDet) or from equivariant 3x3 stride-2
            convs on the input / lateral / output ('on_input', 'on_lateral', 'on_output'; True =
            'on_input'), as in mmdet's FPN.
        start_level, end_level: input levels used (end_level -1 = the last, inclusive otherwise).
        relu_before_extra_convs: ReLU before every extra conv but the first, as in mmdet's FPN.
        upsample_cfg: F.interpolate arguments of the top-down path, as in mmdet's FPN (without a
            scale_factor the coarser level is resized to the finer one's size). Nearest (the
            published ReDet) is not symmetric between odd sizes; bilinear with align_corners=True is.
        num_orientations: N of the rotation group C_N (8 in ReDet).
    Output: a tuple of num_outs plain tensors with out_channels channels (channel = field*N + o).
    """

    def __init__(self,
                 in_channels: Sequence[int],
                 out_channels: int,
                 num_outs: int,
                 start_level: int = 0,
                 end_level: int = -1,
                 add_extra_convs: Union[bool, str] = False,
                 relu_before_extra_convs: bool = False,
                 upsample_cfg: dict = dict(mode="nearest"),
                 num_orientations: int = NUM_ORIENTATIONS,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        in_channels = list(in_channels)
        if not in_channels:
            raise ValueError("ReFPN: in_channels must list at least one level; got []")
        if not 0 <= start_level < len(in_channels):
            raise ValueError(f"ReFPN: start_level must be in [0, {len(in_channels)}); got {start_level}")
        backbone_end_level = len(in_channels) if end_level == -1 else end_level + 1
        if not start_level < backbone_end_level <= len(in_channels):
            raise ValueError(f"ReFPN: end_level must be -1 or in [{start_level}, {len(in_channels)}); "
                             f"got {end_level}")
        num_used = backbone_end_level - start_level
        if num_outs < num_used:
            raise ValueError(f"ReFPN: num_outs must be >= the {num_used} input levels used; got {num_outs}")
        if add_extra_convs is True:
            add_extra_convs = "on_input"
        if add_extra_convs not in (False, "on_input", "on_lateral", "on_output"):
            raise ValueError("ReFPN: add_extra_convs must be False, True, 'on_input', 'on_lateral' or "
                             f"'on_output'; got {add_extra_convs!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_outs = num_outs
        self.start_level = start_level
        self.backbone_end_level = backbone_end_level
        self.add_extra_convs = add_extra_convs
        self.relu_before_extra_convs = relu_before_extra_convs
        self.upsample_cfg = dict(upsample_cfg)

        self.in_types = [regular_type(c, num_orientations, f"in_channels[{i}]")
                         for i, c in enumerate(in_channels)]
        self.out_type = out_type = regular_type(out_channels, num_orientations, "out_channels")
        used = range(start_level, backbone_end_level)
        self.lateral_convs = nn.ModuleList(
            r2conv(self.in_types[i], out_type, 1, bias=True) for i in used)
        self.fpn_convs = nn.ModuleList(
            r2conv(out_type, out_type, 3, padding=1, bias=True) for _ in used)
        self.extra_convs = nn.ModuleList()
        if add_extra_convs:
            for k in range(num_outs - num_used):
                first_in = self.in_types[backbone_end_level - 1] if add_extra_convs == "on_input" else out_type
                self.extra_convs.append(
                    r2conv(first_in if k == 0 else out_type, out_type, 3, stride=2, padding=1, bias=True))

        self.register_load_state_dict_pre_hook(_rename_mmrotate_keys)

    def mmrotate_prefixes(self) -> List[Tuple[str, str]]:
        """(our key prefix, mmrotate ReFPN's key prefix) of every conv, relative to the neck."""
        used = self.backbone_end_level - self.start_level
        pairs = [(f"{name}.{i}.", f"{name}.{i}.conv.")
                 for i in range(used) for name in ("lateral_convs", "fpn_convs")]
        return pairs + [(f"extra_convs.{k}.", f"fpn_convs.{used + k}.conv.")
                        for k in range(len(self.extra_convs))]

    def forward(self, inputs: Sequence) -> tuple:
        if len(inputs) != len(self.in_channels):
            raise ValueError(f"ReFPN: expected {len(self.in_channels)} input levels; got {len(inputs)}")
        levels = range(self.start_level, self.backbone_end_level)
        wrapped = {i: self.wrap_input(inputs[i], self.in_types[i], f"inputs[{i}]") for i in levels}
        laterals = [to_plain(conv(wrapped[i])) for conv, i in zip(self.lateral_convs, levels)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + self._upsampled(laterals[i], laterals[i - 1])
        outs: List = [to_plain(conv(self.wrap(lat, self.out_type))) for conv, lat in zip(self.fpn_convs, laterals)]

        if not self.add_extra_convs:
            while len(outs) < self.num_outs:
                outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        else:
            sources = {"on_input": wrapped[self.backbone_end_level - 1],
                       "on_lateral": self.wrap(laterals[-1], self.out_type),
                       "on_output": self.wrap(outs[-1], self.out_type)}
            x = sources[self.add_extra_convs]
            for k, conv in enumerate(self.extra_convs):
                if k > 0 and self.relu_before_extra_convs:
                    x = self.wrap(F.relu(to_plain(x)), self.out_type)
                x = conv(x)
                outs.append(to_plain(x))
        return tuple(outs)

    def _upsampled(self, coarse: Tensor, fine: Tensor) -> Tensor:
        size = {} if "scale_factor" in self.upsample_cfg else dict(size=fine.shape[2:])
        if self.upsample_cfg.get("mode", "nearest") != "nearest":
            return F.interpolate(coarse, **size, **self.upsample_cfg)
        # Nearest upsampling copies values: exact in any dtype. CUDA autocast would run it in
        # float32, and every sum below it, down to the largest map, would be float32 too.
        with autocast_off(coarse.device.type):
            return F.interpolate(coarse, **size, **self.upsample_cfg)


def _rename_mmrotate_keys(fpn: ReFPN, state_dict, prefix, *_args) -> None:
    pairs = fpn.mmrotate_prefixes()
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for ours, theirs in pairs:
            if rest.startswith(theirs):
                state_dict[prefix + ours + rest[len(theirs):]] = state_dict.pop(key)
                break
