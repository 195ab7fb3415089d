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


@contextlib.contextmanager
def full_fp32():
    """No TF32 in cuDNN convolutions or CUDA matmuls for the block (torch lets cuDNN use it by
    default): two fp32 models compared on a GPU then differ by float rounding, not by TF32's 10-bit
    mantissa amplified through a deep network."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous
