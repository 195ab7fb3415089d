"""Runner hooks, loops and optim wrappers (mm layer)."""
from .atomic_local_backend import AtomicLocalBackend, atomic_write
from .deferred_scalars import defer_scalar
from .optim_wrapper import OptimWrapper
from .peak_memory_hook import PeakMemoryHook, read_peaks
from .runtime_info_hook import RuntimeInfoHook
# (last: the loops import the models, whose CUDA graphs import the optim wrapper above)
from .one_behind_loops import OneBatchBehind, TestLoop, ValLoop  # noqa: E402,I001

__all__ = ['AtomicLocalBackend', 'OneBatchBehind', 'OptimWrapper', 'PeakMemoryHook', 'RuntimeInfoHook', 'TestLoop',
           'ValLoop', 'atomic_write', 'defer_scalar', 'read_peaks']
