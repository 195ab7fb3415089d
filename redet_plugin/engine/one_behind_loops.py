"""Validation and test loops ('RedetValLoop', 'RedetTestLoop') whose GPU does not wait for the
host between batches.

mmengine's loops read each batch's detections back (their data-dependent count) before they load
the next batch, so the GPU idles while the host loads, preprocesses, launches, evaluates and runs
the hooks. These loops launch batch i's forward with its detections kept fixed-size
(keep_padding), then cut, evaluate and hand to the hooks batch i-1's: that read-back waits for
batch i-1 only, with batch i queued behind it on the GPU (batch i-1 is read on a stream that
waits for its step alone). Metrics, outputs and hook arguments are those of mmengine's loops;
each batch's after_*_iter comes after the next batch's before_*_iter. A model that returns cut
results (no padding) runs the same way.
"""
from typing import Callable, Optional

import torch
from mmdet.registry import LOOPS
from mmengine.runner import TestLoop as MMEngineTestLoop
from mmengine.runner import ValLoop as MMEngineValLoop
from mmengine.runner.amp import autocast
# (mmengine's own handling of losses that a val/test step returns, private but what its loops
# call; since mmengine 0.10.5; tests/test_engine/test_library_internals.py pins them)
from mmengine.runner.loops import _parse_losses, _update_losses

from ..structures.padded_results import PendingOutputs, keep_padding
from ..utils.registration import register

__all__ = ['OneBatchBehind', 'TestLoop', 'ValLoop']


class OneBatchBehind:
    """Runs each batch's step, then finishes the batch before it: `finish(idx, batch, outputs)`
    gets outputs cut, read as PendingOutputs reads them (on a GPU, on a stream that waits for
    that batch's step alone). `flush()` finishes the last one."""

    def __init__(self, finish: Callable):
        self.finish = finish
        self.pending: Optional[tuple] = None

    def step(self, idx: int, batch, run_step: Callable) -> None:
        with keep_padding():
            outputs = PendingOutputs(run_step(batch))
        self.flush()
        self.pending = (idx, batch, outputs)

    def flush(self) -> None:
        if self.pending is not None:
            idx, batch, outputs = self.pending
            self.pending = None
            outputs.read(lambda cut: self.finish(idx, batch, cut))


def _run(loop, mode: str, step_name: str, losses: dict) -> dict:
    """mmengine's ValLoop.run / TestLoop.run with each batch finished one batch behind."""
    runner = loop.runner
    runner.call_hook(f'before_{mode}')
    runner.call_hook(f'before_{mode}_epoch')
    runner.model.eval()
    losses.clear()

    def finish(idx, batch, outputs):
        outputs, _ = _update_losses(outputs, losses)
        loop.evaluator.process(data_samples=outputs, data_batch=batch)
        runner.call_hook(f'after_{mode}_iter', batch_idx=idx, data_batch=batch, outputs=outputs)

    def run_step(batch):
        with autocast(enabled=loop.fp16):
            return getattr(runner.model, step_name)(batch)

    behind = OneBatchBehind(finish)
    with torch.no_grad():
        for idx, batch in enumerate(loop.dataloader):
            runner.call_hook(f'before_{mode}_iter', batch_idx=idx, data_batch=batch)
            behind.step(idx, batch, run_step)
        behind.flush()
    metrics = loop.evaluator.evaluate(len(loop.dataloader.dataset))
    if losses:
        metrics.update(_parse_losses(losses, mode))
    runner.call_hook(f'after_{mode}_epoch', metrics=metrics)
    runner.call_hook(f'after_{mode}')
    return metrics


@register(LOOPS)
class ValLoop(MMEngineValLoop):
    """mmengine's ValLoop, each batch evaluated after the next batch's forward is launched."""

    def run(self) -> dict:
        return _run(self, 'val', 'val_step', self.val_loss)


@register(LOOPS)
class TestLoop(MMEngineTestLoop):
    """mmengine's TestLoop, each batch evaluated after the next batch's forward is launched."""

    def run(self) -> dict:
        return _run(self, 'test', 'test_step', self.test_loss)
