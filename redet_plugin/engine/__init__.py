"""Runner hooks (mm layer)."""
from .peak_memory_hook import PeakMemoryHook, read_peaks

__all__ = ['PeakMemoryHook', 'read_peaks']
