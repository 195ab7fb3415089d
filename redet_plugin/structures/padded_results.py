"""Where the test path's one data-dependent shape is made: the cut of fixed-size detections.

The R-CNN head's detections are fixed-size (multiclass_nms_fixed): valid rows first, then
padding. `cut_padding` turns a batch of them into mmdet's results with one read-back for the
whole batch (the valid counts). A captured test forward (cuda_graph_predict) must end before
that read-back: inside `keep_padding()` the head returns the fixed-size results with `valid`,
and the caller cuts them after the graph's replay. The validation and test loops
(engine/one_behind_loops.py) and the patch inference (inference/detector.py) keep the padding
through the whole test step and read a batch's results (PendingOutputs) after the next batch's
forward is launched.
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


def cut_unless_kept(results_list: List[InstanceData]) -> List[InstanceData]:
    """cut_padding, except inside keep_padding() (the caller cuts them later)."""
    return results_list if keeping_padding() else cut_padding(results_list)


def cut_sample_padding(samples: list) -> list:
    """The data samples with their pred_instances cut (cut_padding: one read-back in all)."""
    holders = [s for s in samples if 'pred_instances' in s]
    for sample, pred in zip(holders, cut_padding([s.pred_instances for s in holders])):
        sample.pred_instances = pred
    return samples


_READERS = {}  # device index -> the stream PendingOutputs are read on


class PendingOutputs:
    """A test step's outputs (data samples whose pred_instances may keep their padding),
    launched but not read yet. `read(fn)` returns fn(the samples, cut); on a GPU fn's reads run
    on a stream that waits for this step alone: on the step's stream they would also wait for
    every step launched after it."""

    def __init__(self, samples: list):
        self.samples = samples
        self.done = self.reader = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # (made before the next step is launched: making a stream can wait for the work
            # queued on the device)
            self.reader = _reader(torch.cuda.current_device())
            self.done = torch.cuda.Event()
            self.done.record()

    def read(self, fn):
        if self.done is None:
            return fn(cut_sample_padding(self.samples))
        reader = self.reader
        reader.wait_event(self.done)
        with torch.cuda.stream(reader):
            result = fn(cut_sample_padding(self.samples))
        # (what fn queued is done before the step's stream reuses the samples' memory)
        torch.cuda.current_stream().wait_stream(reader)
        return result


def _reader(device: int) -> torch.cuda.Stream:
    if device not in _READERS:
        _READERS[device] = torch.cuda.Stream()
    return _READERS[device]
