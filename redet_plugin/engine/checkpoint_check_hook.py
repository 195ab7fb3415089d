"""CheckpointCheckHook (registered as 'RedetCheckpointCheckHook'): checks the checkpoint the
Runner loads (load_from, resume) against its model, from the Runner's one read of the file.

mmengine's load is lenient: it loads the weights that fit and warns about the rest, so a
checkpoint of another model or other classes would train or test on silently. The hook runs
when the file is read, before mmengine loads it into the model, and raises
CheckpointMismatchError (one line naming the file) for one that does not fit. tools/train.py
and tools/test.py add it (redet_plugin/engine/cli.py, checked_checkpoint_load).
"""
from typing import Optional, Sequence

from mmdet.registry import HOOKS
from mmengine.hooks import Hook

from ..utils.checkpoint_check import check_checkpoint_fits, check_model_classes
from ..utils.registration import register


@register(HOOKS)
class CheckpointCheckHook(Hook):
    """Args:
        checkpoint_path: the file the Runner loads (for the messages).
        strict: every weight must fit (resume, test); False (load_from, fine-tuning may change
            the heads): most must.
        classes: the data set's classes, which must be those the checkpoint was trained on
            (meta.dataset_meta.classes, where saved); None: not checked.
    """

    # before the other hooks that read the loaded checkpoint (EMAHook loads it into its model)
    priority = 'VERY_HIGH'

    def __init__(self, checkpoint_path: str, strict: bool = True,
                 classes: Optional[Sequence[str]] = None) -> None:
        self.checkpoint_path, self.strict = checkpoint_path, strict
        self.classes = None if classes is None else tuple(classes)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        check_checkpoint_fits(runner.model, checkpoint, self.checkpoint_path, self.strict)
        if self.classes is not None:
            check_model_classes(runner.model, self.classes, checkpoint, self.checkpoint_path)
