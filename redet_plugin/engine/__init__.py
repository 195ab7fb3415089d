"""Runner hooks, loops and optim wrappers (mm layer)."""
# (defer_scalar lives in utils/: the captured training step, a layer below, logs with it too)
from ..utils.deferred_scalars import defer_scalar
from .atomic_local_backend import AtomicLocalBackend, atomic_write, remove_partial_writes
from .bad_images_hook import BadImagesHook
from .checkpoint_hook import CheckpointHook
from .checkpoint_check_hook import CheckpointCheckHook
from .distributed_data_parallel import DistributedDataParallel
from .one_behind_loops import OneBatchBehind, TestLoop, ValLoop
from .nonfinite_steps_hook import NonFiniteStepsError, NonFiniteStepsHook
from .optim_wrapper import AmpOptimWrapper, OptimWrapper
from .peak_memory_hook import PeakMemoryHook, read_peaks
from .plain_test_hook import PlainTestHook
from .progress_bar_hook import ProgressBarHook
from .resumable_loops import (EpochBasedTrainLoop, IterBasedTrainLoop, ResumableBatchSampler,
                              TrainStateHook, resumable_train_cfg)
from .runtime_info_hook import RuntimeInfoHook

__all__ = ['AmpOptimWrapper', 'AtomicLocalBackend', 'BadImagesHook', 'CheckpointCheckHook', 'CheckpointHook', 'DistributedDataParallel', 'EpochBasedTrainLoop', 'IterBasedTrainLoop',
           'NonFiniteStepsError', 'NonFiniteStepsHook', 'OneBatchBehind', 'OptimWrapper', 'PeakMemoryHook', 'PlainTestHook', 'ProgressBarHook', 'ResumableBatchSampler', 'RuntimeInfoHook', 'TestLoop',
           'TrainStateHook', 'ValLoop', 'atomic_write', 'defer_scalar', 'read_peaks', 'remove_partial_writes',
           'resumable_train_cfg']
