"""TF32 for CUDA's float32 matrix products within a block."""
import contextlib

import torch


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """CUDA's float32 matrix products in TF32 for the block when `enabled`, torch's setting as it
    was after it. A CUDA graph captured in the block keeps the kernels chosen then."""
    if not enabled:
        yield
        return
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def tf32_settings() -> tuple:
    """Whether cuDNN's float32 convolutions and CUDA's float32 matrix products may use TF32:
    the kernels a CUDA graph captures depend on them."""
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
