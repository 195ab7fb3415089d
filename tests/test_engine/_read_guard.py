"""A tensor that says when its value is read on the host (item, tolist, float(), ...): a read is
counted where allowed and raises elsewhere. torch.stack and views of guarded tensors are guarded
too (__torch_function__), so a read of a copy is caught as well."""
import contextlib

import torch

_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
          torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
          torch.Tensor.__index__, torch.Tensor.__format__, torch.Tensor.__repr__}


class ReadGuard(torch.Tensor):
    allowed = False
    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _READS:
            if not ReadGuard.allowed:
                raise AssertionError(f'a value was read ({func.__name__}) where none may be')
            ReadGuard.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def guarded(value: float, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(value, dtype=dtype).as_subclass(ReadGuard)


@contextlib.contextmanager
def reads_allowed(allowed: bool = True):
    """Counts the reads in the block (ReadGuard.reads from 0); raises on one where not allowed."""
    ReadGuard.allowed, ReadGuard.reads = allowed, 0
    try:
        yield
    finally:
        ReadGuard.allowed = False
