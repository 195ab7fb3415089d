"""Batch norms folded into the convolutions before them, for an exported model in eval mode.

Folded only where the pairing is plain to see in a module's children, as the backbones that
convert_to_plain makes name them: siblings `conv<k>` (Conv2d) and `bn<k>` (BatchNorm2d), and a
Sequential's Conv2d directly followed by a BatchNorm2d (ReResNet's downsample). The batch norm
becomes an Identity: its module (and name) stays, so forward code that calls it still runs.
"""
import re

from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

_CONV_NAME = re.compile(r'conv(\d*)$')


def fold_batch_norms(module: nn.Module) -> int:
    """Fold every such pair inside `module` (in eval mode), in place; returns how many."""
    if module.training:
        raise ValueError('fold_batch_norms: the module must be in eval mode (its running '
                         'statistics are what is folded)')
    folded = 0
    for parent in list(module.modules()):
        children = dict(parent.named_children())
        if isinstance(parent, nn.Sequential):
            names = list(children)
            pairs = [(a, b) for a, b in zip(names, names[1:])]
        else:
            pairs = [(name, 'bn' + match.group(1)) for name in children
                     if (match := _CONV_NAME.match(name))]
        for conv_name, bn_name in pairs:
            conv, bn = children.get(conv_name), children.get(bn_name)
            if type(conv) is nn.Conv2d and type(bn) is nn.BatchNorm2d and bn.track_running_stats:
                setattr(parent, conv_name, fuse_conv_bn_eval(conv, bn))
                setattr(parent, bn_name, nn.Identity())
                children[conv_name], children[bn_name] = getattr(parent, conv_name), nn.Identity()
                folded += 1
    return folded
