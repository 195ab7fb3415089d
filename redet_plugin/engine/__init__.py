"""Runner hooks and optim wrappers (mm layer)."""
from .deferred_scalars import defer_scalar
from .optim_wrapper import OptimWrapper
from .peak_memory_hook import PeakMemoryHook, read_peaks
from .runtime_info_hook import RuntimeInfoHook

__all__ = ['OptimWrapper', 'PeakMemoryHook', 'RuntimeInfoHook', 'defer_scalar', 'read_peaks']
