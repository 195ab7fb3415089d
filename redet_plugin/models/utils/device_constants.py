"""Small tensors of Python numbers, made once per device and dtype and kept.

A tensor made from Python numbers in every step costs a fill kernel per number, or a copy from
host memory (which waits for the GPU and cannot be captured in a CUDA graph). A kept one costs
nothing after the first step. It is kept only when made outside a CUDA graph capture: a tensor
made while a graph is being captured holds its values only once that graph has run, and another
graph may read it before. Nor is it kept while torch.export or torch.compile traces: the
tensors made then are the tracer's stand-ins, which a later eager step must not get.
"""
import functools
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["constant", "full", "is_capturing", "kept_in"]


def is_capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (False off CUDA)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def _made_fresh(device: torch.device) -> bool:
    """Whether a constant made now must not be kept (see the module's docstring)."""
    return (is_capturing(device) or torch.compiler.is_exporting()
            or torch.compiler.is_compiling())


def constant(values: Sequence[float], dtype: torch.dtype, device) -> Tensor:
    """A (len(values),) tensor of `values`, not to be written to."""
    values, device = tuple(values), torch.device(device)
    if _made_fresh(device):
        return _filled(values, dtype, device)
    return _kept(values, dtype, device)


def full(size: int, value: float, dtype: torch.dtype, device) -> Tensor:
    """constant((value,) * size, ...), keyed by (size, value): for long ones."""
    device = torch.device(device)
    if _made_fresh(device):
        return torch.full((size,), value, dtype=dtype, device=device)
    return _kept_full(size, value, dtype, device)


def kept_in(cache: dict, key, max_size: int, make, device):
    """cache[key], made by make() when missing and kept (the oldest key dropped beyond
    max_size), except when made under graph capture."""
    value = cache.get(key)
    if value is None:
        value = make()
        if not _made_fresh(device):
            if len(cache) >= max_size:
                cache.pop(next(iter(cache)))
            cache[key] = value
    return value


@functools.lru_cache(maxsize=512)  # (a few per model, map size and dtype)
def _kept(values, dtype, device):
    return _filled(values, dtype, device)


@functools.lru_cache(maxsize=512)
def _kept_full(size, value, dtype, device):
    return torch.full((size,), value, dtype=dtype, device=device)


def _filled(values, dtype, device):
    # fills, not torch.tensor(values, device=...): a copy from host memory waits for the GPU
    if len(set(values)) <= 1:
        return torch.full((len(values),), values[0] if values else 0, dtype=dtype, device=device)
    out = torch.empty(len(values), dtype=dtype, device=device)
    for i, v in enumerate(values):
        out[i].fill_(v)
    return out
