"""A training step whose loss or gradients are not finite leaves the model as it was, decided on
the device.

A NaN or infinite loss reaches the weights through the optimizer step, and the batch-norm
statistics through the forward before it. Testing the loss on the host (`if loss.isfinite():`)
would make the host wait for the GPU every step, and cannot run inside a captured CUDA graph.
NonFiniteGuard decides on the device instead: every step runs whole, and afterwards each tensor
it changed gets `torch.where(skip, value before, value after)`, with `skip` a device flag. The
same calls run in the eager step (RedetOptimWrapper, RedetAmpOptimWrapper) and in the captured
one (cuda_graphs/step_graphs.py):

    guard.begin_step(model)        before the forward: copies the normalisation statistics
    guard.check_loss(loss)         each loss that is back-propagated
    norm, flag = guard.step(optimizer, clip, scaler, scale_update)
                                   AMP's unscale, the gradients' check, clipping, copies of the
                                   parameters and their optimizer state, the optimizer step, the
                                   copies put back where the flag says so, AMP's scale update
    guard.record(flag)             outside a capture: for RedetNonFiniteStepsHook to read

The flag is a float32 scalar on the device: 0 for a finite step, else the sum of LOSS_NOT_FINITE
and GRADIENTS_NOT_FINITE (a gradient, or the norm clipping computed, is NaN or infinite).

A skipped step leaves as they were: the parameters that had gradients and their optimizer state
(SGD's momentum, Adam's moments and step count), and the running mean, variance and batch count
of every normalisation layer in training mode. Optimizer state that the step made for the first
time is left at zero, which is where torch's SGD (dampening 0), Adam and AdamW start from, so the
next finite step gives what a first step gives. Adam-like optimizers on a GPU keep their step
count on the host unless `capturable=True`, where no device flag can put it back: the guard
switches such groups to capturable (the same update, with the count on the device). Not put
back: AMP's loss scale (GradScaler lowers it after an overflow, as it should) and the
learning-rate schedule, which moves on.
"""
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

__all__ = ["GRADIENTS_NOT_FINITE", "LOSS_NOT_FINITE", "NonFiniteGuard"]

LOSS_NOT_FINITE = 1
GRADIENTS_NOT_FINITE = 2
_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")

_Copies = Dict[Tuple[torch.device, torch.dtype], torch.Tensor]


class NonFiniteGuard:
    """The device-side skip of non-finite steps for one optimizer (see the module's text)."""

    def __init__(self):
        self._norm_layers: Optional[Tuple[nn.Module, List[nn.Module]]] = None
        self._statistics: Optional[Tuple[List[torch.Tensor], _Copies]] = None
        self._loss_bad: Optional[torch.Tensor] = None
        self._flag: Optional[torch.Tensor] = None
        self._said = set()

    @torch.no_grad()
    def begin_step(self, model: nn.Module) -> None:
        """Before the first forward of a step: copies the statistics the forward will update,
        and forgets what an unfinished step left (e.g. a capture that failed)."""
        tensors = [m._buffers[name] for m in self._norm_layers_of(model) if m.training
                   for name in _STATISTICS if m._buffers.get(name) is not None]
        self._statistics = (tensors, _copies(tensors)) if tensors else None
        self._loss_bad = None

    def check_loss(self, loss: torch.Tensor) -> None:
        """Notes on the device whether `loss` (about to be back-propagated) is finite."""
        bad = torch.isfinite(loss.detach()).all().logical_not()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    @torch.no_grad()  # (the copies and selects write into parameters)
    def step(self, optimizer: torch.optim.Optimizer,
             clip: Optional[Callable[[], Optional[torch.Tensor]]] = None, scaler=None,
             scale_update=None, **step_kwargs) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """optimizer.step(**step_kwargs), undone on the device where the step was not finite.

        clip: clips the gradients and returns their norm (or None); scaler: AMP's GradScaler,
        whose unscale_ comes first and update(scale_update) last (its step, which reads the inf
        check on the host, is not used). Returns (the norm, the flag)."""
        if scaler is not None:
            scaler.unscale_(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        device = params[0].device if params else (
            self._loss_bad.device if self._loss_bad is not None else torch.device("cpu"))
        grads_bad = _any_nonfinite([p.grad for p in params], device)
        norm = clip() if clip is not None else None
        if norm is not None:  # (a norm that overflowed would scale every gradient to zero)
            grads_bad = grads_bad | torch.isfinite(norm.detach()).logical_not().to(device)
        loss_bad = (self._loss_bad.to(device) if self._loss_bad is not None
                    else torch.zeros((), dtype=torch.bool, device=device))
        flag = (loss_bad.float() * LOSS_NOT_FINITE + grads_bad.float() * GRADIENTS_NOT_FINITE)
        skip = loss_bad | grads_bad

        _keep_step_counts_on_device(optimizer)
        state_keys = [(p, k) for p in params for k, v in optimizer.state.get(p, {}).items()
                      if isinstance(v, torch.Tensor)]
        copies = _copies(params + [optimizer.state[p][k] for p, k in state_keys])
        optimizer.step(**step_kwargs)
        # (the state read again: a step may replace a tensor instead of writing into it)
        self._put_back(skip, copies, params + [optimizer.state[p][k] for p, k in state_keys])
        self._zero_new_state(skip, optimizer, params, set((id(p), k) for p, k in state_keys))
        if self._statistics is not None:
            self._put_back(skip, self._statistics[1], self._statistics[0])
        if scaler is not None:
            scaler.update(scale_update)
        self._statistics = self._loss_bad = None
        return norm, flag

    def record(self, flag: torch.Tensor) -> None:
        """Keeps a step's flag (not a placeholder of a capture: a replay's copy) until taken."""
        if self._flag is None:
            self._flag = flag
        else:  # (several steps before the flag is taken: either reason of any of them)
            self._flag = torch.bitwise_or(self._flag.int(), flag.int()).float()

    def take_flag(self) -> Optional[torch.Tensor]:
        """The flag of the steps recorded since the last call (None: no step)."""
        flag, self._flag = self._flag, None
        return flag

    def _norm_layers_of(self, model: nn.Module) -> List[nn.Module]:
        """The modules with running statistics (a walk over every module once per model: a
        detector has hundreds)."""
        if self._norm_layers is None or self._norm_layers[0] is not model:
            layers = [m for m in model.modules()
                      if any(m._buffers.get(name) is not None for name in _STATISTICS)]
            self._norm_layers = (model, layers)
        return self._norm_layers[1]

    def _zero_new_state(self, skip: torch.Tensor, optimizer, params, known: set) -> None:
        """Where `skip`, zeroes the state tensors the step made (not in `known`: (id(param),
        key)), e.g. SGD's momentum at its first step: zero is where torch's optimizers start."""
        for p in params:
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and (id(p), k) not in known:
                    on_device = self._skip_on(skip, v.device, f"new optimizer state {k!r}")
                    if on_device is not None:
                        v.masked_fill_(on_device, 0)

    def _put_back(self, skip: torch.Tensor, copies: _Copies, tensors: List[torch.Tensor]):
        """Where `skip`, each tensor gets its value from `copies` (made by _copies from the same
        tensors, in the same order): one select per device and dtype."""
        for (device, dtype), group in _grouped(tensors).items():
            on_device = self._skip_on(skip, device, "a tensor")
            if on_device is None:
                continue
            current = torch.cat([t.reshape(-1) for t in group])
            torch.where(on_device, copies[(device, dtype)], current, out=current)
            torch._foreach_copy_(group, [c.view(t.shape) for c, t in
                                         zip(current.split([t.numel() for t in group]), group)])

    def _skip_on(self, skip: torch.Tensor, device: torch.device, what: str):
        """The flag on `device`, or None where getting it there would make the host wait (a
        tensor on the host beside a GPU flag): that tensor is not put back (said once)."""
        if device == skip.device:
            return skip
        if device.type == "cpu":
            if what not in self._said:
                self._said.add(what)
                warnings.warn(f"NonFiniteGuard: {what} on the host beside gradients on "
                              f"{skip.device} is not put back after a non-finite step")
            return None
        return skip.to(device, non_blocking=True)


def _grouped(tensors: List[torch.Tensor]) -> Dict[Tuple[torch.device, torch.dtype], list]:
    groups = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def _copies(tensors: List[torch.Tensor]) -> _Copies:
    """One flat copy per device and dtype, in the tensors' order."""
    return {key: torch.cat([t.detach().reshape(-1) for t in group])
            for key, group in _grouped(tensors).items()}


def _any_nonfinite(grads: List[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Whether any gradient holds a NaN or an infinity, as a bool on `device`: GradScaler's
    fused check (one kernel per device and dtype), with an unscale by 1, which changes nothing."""
    found = torch.zeros((), dtype=torch.float32, device=device)
    for (grad_device, _), group in _grouped(
            [g._values() if g.is_sparse else g for g in grads]).items():
        here = found if grad_device == device else torch.zeros((), device=grad_device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            group, here, torch.ones((), device=grad_device))
        if here is not found:
            found += here.to(device, non_blocking=True)
    return found > 0


def _keep_step_counts_on_device(optimizer: torch.optim.Optimizer) -> None:
    """Groups of an Adam-like optimizer (a `capturable` setting) on a GPU, with capturable off:
    their step counts live on the host, where a device flag cannot put them back. Switched to
    capturable (the same update, counts on the device), as a captured step does."""
    for group in optimizer.param_groups:
        if group.get("capturable") is not False or group.get("fused"):
            continue
        params = [p for p in group["params"] if p.is_cuda]
        if not params:
            continue
        group["capturable"] = True
        for p in params:
            state = optimizer.state.get(p, {})
            if isinstance(state.get("step"), torch.Tensor) and state["step"].device != p.device:
                state["step"] = state["step"].to(p.device)
