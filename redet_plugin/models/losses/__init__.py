"""Losses (mmdet MODELS)."""
from .smooth_l1_loss import SmoothL1Loss

__all__ = ['SmoothL1Loss']
