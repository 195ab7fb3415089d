"""unchecked_rois(): the CUDA RoI ops without their check of the rois' values.

On CUDA, roi_pool and riroi_align_rotated(_multilevel) check every call's rois (batch index in
range, finite coordinates, level in range) with one kernel and raise a clear error naming the bad
rows; reading that verdict is one host wait per call. Code whose rois are made by code, such as
the detector's RoI extractors (rois from bbox2roi), can skip it: inside `with unchecked_rois():`
the calling thread's calls enqueue no check and never wait, and a bad row pools zeros (the
kernels' own guards), exactly as inside a CUDA graph. The CPU kernels keep their checks (they
cost no wait).
"""
import contextlib

from .. import _ext


@contextlib.contextmanager
def unchecked_rois():
    if not _ext.is_loaded():  # the ops raise their own "not built" error when called
        yield
        return
    previous = _ext._C.set_roi_value_checks_enabled(False)
    try:
        yield
    finally:
        _ext._C.set_roi_value_checks_enabled(previous)
