"""NonFiniteStepsHook (registered as 'RedetNonFiniteStepsHook'): names each training step whose
loss or gradients were not finite, and stops a run where more than `max_consecutive_nonfinite`
of them came in a row. In a config (configs/_base_/default_runtime.py has it):

    default_hooks = dict(nonfinite_steps=dict(type='RedetNonFiniteStepsHook',
                                              max_consecutive_nonfinite=20))

RedetOptimWrapper and RedetAmpOptimWrapper skip such steps on the device (the parameters, the
optimizer state and the BN statistics stay as they were: redet_plugin/utils/nonfinite_guard.py),
eager or captured. This hook takes each iteration's flag, with the iteration and the image paths
of its batch kept on the host, and reads the flags back with the logged losses: once per log
interval under RedetRuntimeInfoHook (redet_plugin/utils/deferred_scalars.py), at once without
it. Then, per skipped step, one warning line:

    non-finite step at iteration 12 (epoch 1, batch 12): the loss is not finite; skipped, the
    parameters, optimizer state and BN statistics are as before it (3 so far); images: a.png, b.png

and when more than max_consecutive_nonfinite steps in a row were skipped, NonFiniteStepsError
(tools/train.py prints its one line and exits with status 1). Every flag is read, so a streak
within a log interval is found, but only when the flags are read: the run stops at the next log
line after the streak passes the limit. The default, 20, is more than the steps AMP's dynamic
loss scale needs to come down from its start (2**16) to 1 after overflows; a run whose steps
still overflow there, or whose loss stays NaN that long, does not recover by itself.

With several GPUs each process reads its own flags (all processes skip the same steps: the
gradients are averaged) and names the images of its own part of the batch; the log shows the
first process's.
"""
import logging
from functools import partial
from typing import List

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.logging import print_log

from ..utils.deferred_scalars import defer_read, flush_queue
from ..utils.nonfinite_guard import LOSS_NOT_FINITE
from ..utils.registration import register

_LISTED = 20  # skipped steps named at the end of training, at most


class NonFiniteStepsError(RuntimeError):
    """Too many training steps in a row had a non-finite loss or gradients."""


def batch_images(data_batch) -> List[str]:
    """The image paths (else ids) of a batch's data samples, as the data sets' metainfo has
    them; empty where the batch has none."""
    samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
    names = []
    for sample in samples or ():
        metainfo = sample if isinstance(sample, dict) else getattr(sample, 'metainfo', {})
        name = metainfo.get('img_path') or metainfo.get('img_id')
        if name is not None:
            names.append(str(name))
    return names


def _guards(optim_wrapper) -> list:
    """The non-finite guards of an optim wrapper (or of each in an OptimWrapperDict)."""
    wrappers = optim_wrapper.values() if hasattr(optim_wrapper, 'values') else [optim_wrapper]
    return [w.nonfinite_guard for w in wrappers if hasattr(w, 'nonfinite_guard')]


@register(HOOKS)
class NonFiniteStepsHook(Hook):
    """Logs the training steps skipped as non-finite; stops after too many in a row.

    Args:
        max_consecutive_nonfinite: the most skipped steps in a row that a run goes on after
            (0: it stops at the first).
    """

    # before RedetRuntimeInfoHook (VERY_HIGH) flushes after an iteration: the iteration's flag
    # is then read with its losses
    priority = 'HIGHEST'

    def __init__(self, max_consecutive_nonfinite: int = 20) -> None:
        if not isinstance(max_consecutive_nonfinite, int) or \
                isinstance(max_consecutive_nonfinite, bool) or max_consecutive_nonfinite < 0:
            raise ValueError('RedetNonFiniteStepsHook: max_consecutive_nonfinite must be an int '
                             f'>= 0; got {max_consecutive_nonfinite!r}')
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.skipped: List[str] = []  # where each skipped step was, in order
        self._streak: List[str] = []  # where the skipped steps in a row so far were
        self._guards: list = []
        self._amp = False

    def before_train(self, runner) -> None:
        self._guards = _guards(runner.optim_wrapper)
        self._amp = hasattr(runner.optim_wrapper, 'loss_scaler')
        if not self._guards:
            print_log(f'RedetNonFiniteStepsHook: {type(runner.optim_wrapper).__name__} does not '
                      'skip non-finite steps (RedetOptimWrapper and RedetAmpOptimWrapper do): '
                      'a NaN loss goes into the weights', logger='current', level=logging.WARNING)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        flags = [flag for flag in (g.take_flag() for g in self._guards) if flag is not None]
        if not flags:  # (no optimizer step this iteration: gradient accumulation)
            return
        flag = flags[0] if len(flags) == 1 else _either(flags)
        where = f'iteration {runner.iter + 1}'
        if getattr(runner.log_processor, 'by_epoch', False):
            where += f' (epoch {runner.epoch + 1}, batch {batch_idx + 1})'
        defer_read(flag, partial(self._read, where, batch_images(data_batch)),
                   message_hub=runner.message_hub)

    def _read(self, where: str, images: List[str], flag: float) -> None:
        """One step's flag, read back (in the order of the steps)."""
        flag = int(flag)
        if flag == 0:
            self._streak = []
            return
        self.skipped.append(where)
        self._streak.append(where)
        if flag & LOSS_NOT_FINITE:
            reason = 'the loss is not finite'
        else:
            reason = 'a gradient is not finite' + (
                ' (under AMP this is often the loss scale overflowing float16: the scaler '
                'lowers it)' if self._amp else '')
        print_log(f'non-finite step at {where}: {reason}; skipped, the parameters, optimizer '
                  'state and BN statistics are as before it '
                  f'({len(self.skipped)} so far); images: {", ".join(images) or "not known"}',
                  logger='current', level=logging.WARNING)
        if len(self._streak) > self.max_consecutive_nonfinite:
            steps = (f'{len(self._streak)} training steps in a row' if len(self._streak) > 1
                     else 'a training step')
            where = (f'{self._streak[0]} to {self._streak[-1]}' if len(self._streak) > 1
                     else self._streak[0])
            raise NonFiniteStepsError(
                f'{steps} had a non-finite loss or gradients ({where}), more than '
                f'max_consecutive_nonfinite={self.max_consecutive_nonfinite}: the training '
                'diverged; lower the learning rate or check the images logged for those steps '
                '(default_hooks.nonfinite_steps.max_consecutive_nonfinite sets the limit)')

    def after_train(self, runner) -> None:
        flush_queue(runner.message_hub)  # (the last steps' flags: before the count below)
        if self.skipped:
            count = len(self.skipped)
            listed = ', '.join(self.skipped[:_LISTED]) + (
                f' and {count - _LISTED} more' if count > _LISTED else '')
            print_log(f'{count} training step{"s were" if count != 1 else " was"} skipped: '
                      f'the loss or gradients were not finite (at {listed})',
                      logger='current', level=logging.WARNING)


def _either(flags: List[torch.Tensor]) -> torch.Tensor:
    """The flags of several optimizers' steps in one iteration, as one (either reason)."""
    combined = flags[0].int()
    for flag in flags[1:]:
        combined = combined | flag.to(combined.device).int()
    return combined.float()
