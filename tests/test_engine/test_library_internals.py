"""The private mmengine functions the one-behind loops call (engine/one_behind_loops.py) still do
what mmengine's own ValLoop and TestLoop do with them, in the installed version. A failure names
the library and the function that changed."""
import importlib

import torch
from mmengine.logging import HistoryBuffer
from mmengine.structures import BaseDataElement


def _loops_function(name: str):
    loops = importlib.import_module('mmengine.runner.loops')
    assert hasattr(loops, name), (
        f"mmengine's mmengine.runner.loops.{name} is gone; update "
        'redet_plugin/engine/one_behind_loops.py for the installed version')
    return getattr(loops, name)


def test_update_losses_takes_the_loss_element_off_the_outputs():
    update_losses = _loops_function('_update_losses')
    sample = BaseDataElement(metainfo=dict(img_id=0))
    outputs = [sample, BaseDataElement(loss=dict(loss_cls=torch.tensor(2.0),
                                                 loss_bbox=[torch.tensor(1.0), torch.tensor(3.0)]))]
    losses = {}
    kept, losses = update_losses(outputs, losses)
    assert kept == [sample] and set(losses) == {'loss_cls', 'loss_bbox'}, (
        "mmengine's mmengine.runner.loops._update_losses changed: it no longer takes a trailing "
        f"loss element off the outputs into HistoryBuffers (kept {kept}, losses {losses})")
    assert losses['loss_bbox'].mean() == 2.0
    plain = [sample]
    assert update_losses(plain, {}) == (plain, {})


def test_parse_losses_averages_and_sums_the_losses():
    parse_losses = _loops_function('_parse_losses')
    losses = {'loss_cls': HistoryBuffer(), 'acc': HistoryBuffer()}
    for value in (1.0, 3.0):
        losses['loss_cls'].update(value)
        losses['acc'].update(value * 10)
    parsed = parse_losses(losses, 'val')
    assert parsed == {'loss_cls': 2.0, 'acc': 20.0, 'val_loss': 2.0}, (
        "mmengine's mmengine.runner.loops._parse_losses changed: expected the mean of each "
        f"history and their '<stage>_loss' sum over the loss keys, got {parsed}")
