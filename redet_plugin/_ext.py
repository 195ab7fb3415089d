"""Loads the compiled ops (redet_plugin._C) and explains how to rebuild them when they are missing."""
import torch

try:
    from . import _C  # noqa: F401  (registers the torch.ops.redet.* kernels)
    LOAD_ERROR = None
except ImportError as error:  # not built, or built against another torch
    _C = None
    LOAD_ERROR = error

REBUILD_HINT = ("build it with `pip install --no-build-isolation -e .` in the redet_plugin "
                "checkout (or `bash scripts/install.sh`)")


def is_loaded() -> bool:
    return _C is not None


def with_cuda() -> bool:
    return _C is not None and bool(_C.with_cuda)


def require(op: str, *tensors: torch.Tensor) -> None:
    """Raises a clear error when the compiled library cannot run `op` on these tensors."""
    if _C is None:
        raise RuntimeError(f"redet_plugin.ops.{op}: the compiled library redet_plugin._C could "
                           f"not be loaded ({LOAD_ERROR}); {REBUILD_HINT}.")
    if not with_cuda() and any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        raise RuntimeError(f"redet_plugin.ops.{op}: got CUDA tensors, but redet_plugin._C was "
                           "built without CUDA. Rebuild on a machine with CUDA: "
                           "`FORCE_CUDA=1 pip install --no-build-isolation -e .`")
