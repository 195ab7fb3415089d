"""A model's equivariant networks (ReResNet, ReFPN) as plain convolutions with their batch norms
folded in, for inference.

In eval mode an e2cnn network computes what a plain network with the same numbers computes, but
each e2cnn module wraps and unwraps its tensors and each field norm splits its channels by field
type: many small launches. The plain form (e2cnn's own export, then each BatchNorm2d folded into
the convolution before it) runs the same arithmetic up to float rounding, in a few large
convolutions; on a GPU the ReResNet's run with their ReLUs and residual sums inside cuDNN's
convolution (fuse_epilogues). Training needs the equivariant modules: the conversion is for test
and inference only, and cannot be undone in place.
"""
import torch
from torch import nn

from ..models.layers.equivariant import EquivariantNetwork
from .batch_norm_folding import fold_batch_norms

__all__ = ["fuse_epilogues", "make_plain"]


def make_plain(model: nn.Module, half: bool = False) -> int:
    """Puts `model` in eval mode and converts its equivariant networks, in place; returns how
    many networks were converted (0: none left to convert).

    half: for a model that runs only under fp16 autocast (`--amp`): the converted networks'
    convolution weights are stored in fp16, the dtype autocast runs a convolution in, so that it
    does not cast each of them again at every forward (the same numbers).
    """
    model.eval()
    networks = [m for m in model.modules()
                if isinstance(m, EquivariantNetwork) and not m.exported]
    for network in networks:
        network.export()
        fold_batch_norms(network)
        fuse_epilogues(network)
        if half:
            for conv in network.modules():
                if type(conv) is nn.Conv2d:
                    conv.to(torch.float16)
    return len(networks)


def fuse_epilogues(network: nn.Module) -> int:
    """Switches on `fused` (each convolution with its ReLU, and the residual sum, in one call:
    models/layers/fused_convolution.py) in every module of `network` that has the switch and
    whose batch norms are all folded away; returns how many."""
    switched = 0
    for module in network.modules():
        norms = [child for name, child in module.named_children() if name.startswith('bn')]
        if hasattr(module, 'fused') and norms and all(type(n) is nn.Identity for n in norms):
            module.fused = True
            switched += 1
    return switched
