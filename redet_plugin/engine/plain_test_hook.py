"""Tests with the backbone and neck as plain convolutions (inference/plain_model.py)."""
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from ..inference.plain_model import make_plain

__all__ = ["PlainTestHook"]


class PlainTestHook(Hook):
    """Before the test loop (after the checkpoint is loaded), converts the model's equivariant
    networks to plain convolutions with folded batch norms: the same detections up to float
    rounding, in less time. tools/test.py registers it unless given --equivariant."""

    priority = "VERY_HIGH"

    def before_test(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        # (the test loop's fp16: tools/test.py --amp)
        converted = make_plain(model, half=bool(getattr(runner.test_loop, 'fp16', False)))
        if converted:
            print_log(f"test: {converted} equivariant network(s) run as plain convolutions with "
                      "folded batch norms (--equivariant keeps e2cnn's modules)", logger="current")
