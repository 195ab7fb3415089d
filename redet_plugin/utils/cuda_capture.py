"""Capturing a CUDA graph so that a capture that fails leaves the process usable."""
import contextlib

import torch

__all__ = ["CAPTURE_MODE", "capture_graph", "failure_reason", "on_capture_stream"]

CAPTURE_MODE = "thread_local"  # a data loader's pin-memory thread may keep using CUDA
_CAPTURE_STREAMS = {}  # device index -> the side stream of every capture on that device


def _capture_stream() -> torch.cuda.Stream:
    """One side stream per device for all captures. The caching allocator gives a freed block
    only to allocations on the stream that made it: graphs that share a memory pool reuse each
    other's memory only when they were captured on the same stream; on streams of their own,
    each graph would add its whole footprint to the pool."""
    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[device]


@contextlib.contextmanager
def on_capture_stream():
    """Runs the block (e.g. the eager warm-up before a capture) on the device's capture stream,
    ordered after the work queued so far and before the work queued after it. Memory the
    block frees stays cached for that stream, where the next warm-up finds it again."""
    side = _capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        torch.cuda.current_stream().wait_stream(side)


@contextlib.contextmanager
def capture_graph(graph: torch.cuda.CUDAGraph, pool=None):
    """Captures the block's work into `graph` (memory from `pool`; None: a pool of its own), on
    the device's capture stream.

    A capture that fails ends without its generator epilogue: torch's default CUDA generator
    stays marked as capturing, and every later random draw of the process raises ("Offset
    increment outside graph capture"). Its state from before the capture is put back.
    """
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    saved = generator.clone_state()
    side = _capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side), torch.cuda.graph(graph, pool=pool, stream=side,
                                                       capture_error_mode=CAPTURE_MODE):
            yield
    except BaseException:
        generator.graphsafe_set_state(saved)
        raise
    finally:
        torch.cuda.current_stream().wait_stream(side)


def failure_reason(error: BaseException) -> str:
    """One line for the log. An operation that a capture forbids (a read-back, a host wait)
    often fails only at the capture's end ("a previous error during capture"), so the line
    says how to find it."""
    first = (str(error).strip().splitlines() or [""])[0]
    return (f"the capture failed ({type(error).__name__}: {first}); an eager step under "
            "torch.cuda.set_sync_debug_mode('error') names an operation that waits for the GPU")
