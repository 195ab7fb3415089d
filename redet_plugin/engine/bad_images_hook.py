"""BadImagesHook (registered as 'RedetBadImagesHook'): lists, at the end of a run, the images a
data set with on_bad_image='skip' left out (redet_plugin/datasets/bad_images.py).

Those found while the data set was listed are in the data set's `skipped_images`; those found
when loaded in a loader worker come to the main process in the metainfo of the data sample that
replaced them. The list goes to the log (a warning) and to <log_dir>/skipped_images.txt.
tools/train.py and tools/test.py add the hook.
"""
import os.path as osp
from typing import List

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.logging import print_log

from ..datasets.bad_images import SKIPPED_KEY
from ..utils.registration import register


def _datasets(dataset) -> list:
    """The data set and those it wraps (mmengine's ConcatDataset, RepeatDataset, ...)."""
    found = [dataset]
    for inner in [getattr(dataset, 'dataset', None), *getattr(dataset, 'datasets', [])]:
        if inner is not None:
            found += _datasets(inner)
    return found


@register(HOOKS)
class BadImagesHook(Hook):
    """Collects the images left out as unreadable and lists them after training and after a test."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.skipped: List[str] = []  # 'path: reason', in the order found

    def _add(self, entries) -> None:
        for entry in entries or ():
            if entry not in self.skipped:
                self.skipped.append(entry)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
        for sample in samples or ():
            metainfo = getattr(sample, 'metainfo', None) or {}
            self._add(metainfo.get(SKIPPED_KEY))

    def after_train(self, runner) -> None:
        self._report(runner, runner.train_dataloader.dataset, 'training')

    def after_test(self, runner) -> None:
        self._report(runner, runner.test_dataloader.dataset, 'test')

    def _report(self, runner, dataset, stage: str) -> None:
        found_in_batches, self.skipped = self.skipped, []
        for each in _datasets(dataset):  # (those found when listed first)
            self._add(getattr(each, 'skipped_images', None))
        self._add(found_in_batches)
        if not self.skipped:
            return
        count = len(self.skipped)
        print_log(f"{count} unreadable image{'s' if count != 1 else ''} left out of the {stage} "
                  f"(on_bad_image='skip'):\n" + '\n'.join(f'  {entry}' for entry in self.skipped),
                  logger='current', level=30)
        log_dir = getattr(runner, 'log_dir', None)
        if log_dir and osp.isdir(log_dir):
            with open(osp.join(log_dir, 'skipped_images.txt'), 'w') as f:
                f.write(''.join(f'{entry}\n' for entry in self.skipped))
