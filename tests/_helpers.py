"""Small helpers shared by the tests."""
import contextlib

import torch


@contextlib.contextmanager
def deterministic_mode():
    """torch.use_deterministic_algorithms(True) for the block, restoring the previous setting."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)
