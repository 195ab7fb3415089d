"""Runner hooks, loops and optim wrappers (mm layer)."""
from .atomic_local_backend import AtomicLocalBackend, atomic_write, remove_partial_writes
from .bad_images_hook import BadImagesHook
from .checkpoint_hook import CheckpointHook
from .deferred_scalars import defer_scalar
from .optim_wrapper import OptimWrapper
from .peak_memory_hook import PeakMemoryHook, read_peaks
from .resumable_loops import (EpochBasedTrainLoop, IterBasedTrainLoop, ResumableBatchSampler,
                              TrainStateHook, resumable_train_cfg)
from .runtime_info_hook import RuntimeInfoHook
# (last: the loops import the models, whose CUDA graphs import the optim wrapper above)
from .one_behind_loops import OneBatchBehind, TestLoop, ValLoop  # noqa: E402,I001

__all__ = ['AtomicLocalBackend', 'BadImagesHook', 'CheckpointHook', 'EpochBasedTrainLoop', 'IterBasedTrainLoop', 'OneBatchBehind',
           'OptimWrapper', 'PeakMemoryHook', 'ResumableBatchSampler', 'RuntimeInfoHook', 'TestLoop',
           'TrainStateHook', 'ValLoop', 'atomic_write', 'defer_scalar', 'read_peaks', 'remove_partial_writes',
           'resumable_train_cfg']
