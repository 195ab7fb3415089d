"""Whether a package (its metadata, deploy/package_format.py) can run here: the torch and
redet_plugin versions it was made with, and its device. One line each that names both sides."""
from typing import Optional

import torch

from ..version import __version__ as PLUGIN_VERSION


class PackageMismatchError(RuntimeError):
    """The package was made for another torch or redet_plugin version, or another device."""


def check_versions(meta: dict, path: str) -> None:
    made, here = (meta['torch'], meta['plugin']), (torch.__version__, PLUGIN_VERSION)
    if made != here:
        raise PackageMismatchError(
            f'package {path!r} was exported with torch {made[0]} and redet_plugin {made[1]}; this '
            f'is torch {here[0]} and redet_plugin {here[1]}: export it again here (tools/export.py)')


def run_device(meta: dict, device: Optional[str], path: str) -> torch.device:
    """The device the package runs on: `device` (default: the package's) if it is the kind the
    package was made for and present here."""
    made_for = str(meta['device'])
    try:
        chosen = torch.device(device if device is not None else made_for)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if chosen.type != made_for:
        raise ValueError(f'device: package {path!r} was exported for {made_for}, not '
                         f'{chosen.type}: export it again with --device {chosen.type}')
    if chosen.type == 'cuda':
        if not torch.cuda.is_available():
            raise PackageMismatchError(f'package {path!r} was exported for cuda, and torch sees no '
                                       f'CUDA device here')
        if chosen.index is None:
            chosen = torch.device('cuda', torch.cuda.current_device())
    return chosen
