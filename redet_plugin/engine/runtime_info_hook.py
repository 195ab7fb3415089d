"""RuntimeInfoHook (registered as 'RedetRuntimeInfoHook'): mmengine's RuntimeInfoHook whose
training scalars are read back from the device once per log interval, not once per value per
iteration. In a config: default_hooks = dict(runtime_info=dict(type='RedetRuntimeInfoHook'))
(from another project's scope, e.g. mmrotate's: type='mmdet.RedetRuntimeInfoHook').

mmengine's hook puts every loss of a training step into the message hub with update_scalar,
whose `.item()` makes the host wait for the GPU each iteration. This hook queues the step's
outputs, and what defer_scalar records (the gradient norm of RedetOptimWrapper), on the runner's
message hub (redet_plugin/utils/deferred_scalars.py), and flushes the queue before anything
reads the histories:
- after an iteration where a LoggerHook logs (every `interval` iterations of an epoch, as
  LoggerHook decides), after the last iteration of an epoch and of training (this hook runs
  before the LoggerHook: priority VERY_HIGH),
- after an iteration that brings a key the hub has not seen (the first ones): the histories are
  then created in mmengine's order, which is the order of the values on a log line,
- before validation, before a checkpoint is saved (its message hub state is replaced by the
  flushed one, so a resumed run has the same histories) and at the end of training.
The histories are those of mmengine's hook: same values, counts and order. A hook of another
project that reads training scalars at other iterations sees them up to the last flush.
"""
from typing import Optional

from mmdet.registry import HOOKS
from mmengine.hooks import LoggerHook
from mmengine.hooks import RuntimeInfoHook as MMEngineRuntimeInfoHook
from mmengine.utils import apply_to

from ..utils.deferred_scalars import attach_queue, detach_queue
from ..utils.registration import register


@register(HOOKS)
class RuntimeInfoHook(MMEngineRuntimeInfoHook):
    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        super().before_run(runner)
        self._queue = attach_queue(runner.message_hub)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        if outputs is not None:
            for key, value in outputs.items():
                self._queue.add(f'train/{key}', value)
        if self._queue.has_new_keys() or self._logs_after(runner, batch_idx):
            self._queue.flush()

    def _logs_after(self, runner, batch_idx: int) -> bool:
        """Whether a LoggerHook may read the histories after this iteration (its own test, or
        more: the end of every epoch whatever its `ignore_last`, and the end of training)."""
        if self.end_of_epoch(runner.train_dataloader, batch_idx) or \
                self.is_last_train_iter(runner):
            return True
        return any(self.every_n_inner_iters(batch_idx, hook.interval)
                   for hook in runner.hooks if isinstance(hook, LoggerHook))

    def before_val(self, runner) -> None:
        self._queue.flush()
        super().before_val(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if len(self._queue):  # (a checkpoint between two log iterations, e.g. by iterations)
            self._queue.flush()
            # what Runner.save_checkpoint stores, taken again after the flush
            checkpoint['message_hub'] = apply_to(runner.message_hub.state_dict(),
                                                 lambda x: hasattr(x, 'cpu'), lambda x: x.cpu())

    def after_train(self, runner) -> None:
        self._queue.flush()
        super().after_train(runner)

    def after_run(self, runner) -> None:
        detach_queue(runner.message_hub)  # (flushes what is left)
