"""ProgressBarHook (registered as 'RedetProgressBarHook'): a progress bar over the test images,
which tools/test.py adds (mmengine only logs every n iterations)."""
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.utils import ProgressBar

from ..utils.registration import register


@register(HOOKS)
class ProgressBarHook(Hook):
    """Shows a progress bar on the main process while the test loop runs."""

    def before_test(self, runner) -> None:
        self.bar = ProgressBar(len(runner.test_dataloader.dataset)) if runner.rank == 0 else None

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.bar is not None:
            for _ in outputs or ():
                self.bar.update()

    def after_test(self, runner) -> None:
        if self.bar is not None:
            print()
