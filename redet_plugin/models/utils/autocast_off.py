"""A region where autocast casts nothing (a no-op on devices without autocast)."""
import contextlib

import torch

__all__ = ["autocast_off"]


def autocast_off(device_type: str):
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
