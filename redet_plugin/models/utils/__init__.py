"""Small helpers of the model components (nothing registered): device constants and autocast."""
from .autocast_off import autocast_off
from .device_constants import constant, full, is_capturing, kept_in

__all__ = ['autocast_off', 'constant', 'full', 'is_capturing', 'kept_in']
