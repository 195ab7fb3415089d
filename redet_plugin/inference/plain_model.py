"""A model's equivariant networks (ReResNet, ReFPN) as plain convolutions with their batch norms
folded in, for inference.

In eval mode an e2cnn network computes what a plain network with the same numbers computes, but
each e2cnn module wraps and unwraps its tensors and each field norm splits its channels by field
type: many small launches. The plain form (e2cnn's own export, then each BatchNorm2d folded into
the convolution before it) runs the same arithmetic up to float rounding, in a few large
convolutions. Training needs the equivariant modules: the conversion is for test and inference
only, and cannot be undone in place.
"""
from torch import nn

from ..models.layers.equivariant import EquivariantNetwork
from .batch_norm_folding import fold_batch_norms

__all__ = ["make_plain"]


def make_plain(model: nn.Module) -> int:
    """Puts `model` in eval mode and converts its equivariant networks, in place; returns how
    many networks were converted (0: none left to convert)."""
    model.eval()
    networks = [m for m in model.modules()
                if isinstance(m, EquivariantNetwork) and not m.exported]
    for network in networks:
        network.export()
        fold_batch_norms(network)
    return len(networks)
