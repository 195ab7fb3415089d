"""The private state of mmengine's optim wrappers and torch's optimizers that a captured training
step reads or writes, in one place.

A captured step replaces OptimWrapper.update_params (its backward, clipping and step run inside
the graph), so it must do the wrapper's bookkeeping itself, and it needs what neither library
offers a public accessor for. tests/test_cuda_graphs/test_optim_internals.py pins every name here
against the installed mmengine and torch, and fails naming the library and attribute when a
version changes one.
"""
import torch

__all__ = ["accumulative_counts", "count_backward", "scale_update_param",
           "set_takes_scaler_tensors", "takes_scaler_tensors"]


def count_backward(optim_wrapper) -> None:
    """Counts one backward, as OptimWrapper.backward does: should_update and scale_loss read
    the count, and the public `inner_count` is read-only."""
    optim_wrapper._inner_count += 1


def accumulative_counts(optim_wrapper) -> int:
    """The wrapper's `accumulative_counts` argument (gradient accumulation when > 1)."""
    return optim_wrapper._accumulative_counts


def scale_update_param(optim_wrapper):
    """What AmpOptimWrapper.step passes to GradScaler.update: the static loss scale, or None
    (dynamic scaling)."""
    return optim_wrapper._scale_update_param


def takes_scaler_tensors(optimizer: torch.optim.Optimizer) -> bool:
    """Whether GradScaler.step hands the optimizer the scale and the inf flag as device tensors
    (`grad_scale`, `found_inf`) instead of reading the flag on the host. Torch sets it for its
    fused optimizers."""
    return getattr(optimizer, "_step_supports_amp_scaling", False)


def set_takes_scaler_tensors(optimizer: torch.optim.Optimizer, value: bool) -> None:
    """Sets what takes_scaler_tensors reads (an SGD made without fused=True runs fused steps
    inside a capture)."""
    optimizer._step_supports_amp_scaling = value
