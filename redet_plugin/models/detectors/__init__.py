"""Detectors (mmdet MODELS)."""
from .redet import ReDet

__all__ = ['ReDet']
