"""Where the test path's one data-dependent shape is made: the cut of fixed-size detections.

The R-CNN head's detections are fixed-size (multiclass_nms_fixed): valid rows first, then
padding. `cut_padding` turns a batch of them into mmdet's results with one read-back for the
whole batch (the valid counts). A captured test forward (cuda_graph_predict) must end before
that read-back: inside `keep_padding()` the head returns the fixed-size results with `valid`,
and the caller cuts them after the graph's replay. The validation and test loops
(engine/one_behind_loops.py) keep the padding through the whole test step and cut a batch's
results after the next batch's forward is launched.
"""
import contextlib
import threading
from typing import List

import torch
from mmengine.structures import InstanceData

_STATE = threading.local()


@contextlib.contextmanager
def keep_padding():
    """Within the block (this thread), heads return fixed-size results with `valid`."""
    previous = getattr(_STATE, 'keep', False)
    _STATE.keep = True
    try:
        yield
    finally:
        _STATE.keep = previous


def keeping_padding() -> bool:
    return getattr(_STATE, 'keep', False)


def cut_padding(results_list: List[InstanceData]) -> List[InstanceData]:
    """Each result's valid rows (they come first), without `valid`: one read-back in all."""
    padded = [i for i, res in enumerate(results_list) if 'valid' in res]
    if not padded:
        return results_list
    counts = torch.stack([results_list[i].valid.sum() for i in padded]).tolist()
    results_list = list(results_list)
    for i, count in zip(padded, counts):
        res = results_list[i]
        cut = InstanceData(metainfo=res.metainfo)
        for key, value in res.items():
            if key != 'valid':
                cut[key] = value[:count]
        results_list[i] = cut
    return results_list


def cut_sample_padding(samples: list) -> list:
    """The data samples with their pred_instances cut (cut_padding: one read-back in all)."""
    holders = [s for s in samples if 'pred_instances' in s]
    for sample, pred in zip(holders, cut_padding([s.pred_instances for s in holders])):
        sample.pred_instances = pred
    return samples
