"""A whole training step replayed as one CUDA graph (ReDet's `cuda_graph_step` option).

The model's training step waits for nothing on the host (fixed-size proposals, samples and
targets), so forward, backward, gradient clipping and the optimizer step can be captured once
and replayed with one launch per iteration: the host only copies the next batch into the
graph's inputs.

What a captured step needs, and what it does about it:
- Fixed shapes. Each image's gts are padded to a capacity (a power of two, at least
  `min_gt_capacity`) and marked by `gt_instances.valid` (ignored gts likewise); the model then
  gives the losses of the real gts alone. One graph per (input shape, image shapes, capacity,
  module state, optimizer hyper-parameters), up to `max_graphs`; all of them share one memory
  pool (they never run at the same time, and nothing one of them leaves behind is read by
  another).
- A learning rate that changes. The param schedulers write Python floats; the captured
  optimizer step reads lr from a device tensor that each replay fills from the float. SGD is
  captured as torch's fused SGD kernel (the foreach step's update, with lr rounded to float32);
  Adam and AdamW as their capturable step, which they keep from then on.
- Gradient clipping: `clip_grad_norm_`/`clip_grad_value_` run in the graph; the norm is logged
  through redet_plugin.utils.deferred_scalars.defer_scalar (read back once per log interval).
- Warm-up: the first `warmup_iters` steps of each graph's key run eagerly (cuDNN/cuBLAS set-up,
  lazily built caches, the optimizer's momentum buffers), then the next one is captured. A key
  that differs from a captured one in gt capacity alone is captured at once: its eager steps
  would only regrow the eager memory cache beside the graphs' pool. The warm-up steps compute
  as the replays do (padded gts, the graph's optimizer kernels), so they draw the same random
  numbers: a run resumed from a checkpoint, whose first steps are warm-up steps again, continues
  as the uninterrupted run did (one process; with several, the warm-up is the model's eager
  step).

Non-finite steps: with RedetOptimWrapper or RedetAmpOptimWrapper, the graph runs the wrapper's
guard (redet_plugin/utils/nonfinite_guard.py), the same calls as the eager step: a step whose
loss or gradients are not finite leaves the parameters, the optimizer state and the BN
statistics as they were, decided on the device; each replay hands a copy of its flag to the
guard, for RedetNonFiniteStepsHook to read with the losses.

AMP: RedetAmpOptimWrapper is captured with SGD, Adam and AdamW: the guard unscales, checks and
steps without GradScaler.step (which reads the inf check on the host), and the scaler's update
runs on the device. mmengine's AmpOptimWrapper is captured with SGD: torch's fused SGD takes the
loss scaler's scale and inf flag as device tensors. SGD's momentum buffers that no step has made
yet are made as zeros before each warm-up step and before the capture (a first step's result
when dampening is 0; with dampening, eager steps run until one has made them): a step that the
inf check skips then leaves zeros, not the fused step's uninitialised buffers.

Anything a graph cannot serve runs the eager step, with one line (once per reason) naming why:
an optim wrapper it does not know (capturable_wrappers.py), mmengine's AmpOptimWrapper with
another optimizer than SGD (its loss scaling would read the inf flag on the host), gradient
accumulation, an optimizer other than SGD, Adam and AdamW, SyncBatchNorm, inputs not on CUDA,
more layouts than `max_graphs`, or a capture that failed (e.g. a hook that reads a value): then
the error's first line is given and eager steps are used from then on.

Several processes (RedetDistributedDataParallel hands each process's step here with a
DistributedStep, cuda_graphs/distributed_step.py): the graph averages the gradients with one
NCCL all-reduce after the backward, and the processes agree before each step on the gt capacity
and on capturing, replaying or running eagerly, all of them alike.

Parameters, buffers and optimizer state are read and written in place; one that is replaced
(`.to()`, a loaded optimizer state) makes its graph be captured again.
"""
from typing import Optional

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.structures import InstanceData
from torch import nn

from ..structures.gt_padding import pad_gt_instances
from ..utils.cuda_capture import capture_graph
from ..utils.deferred_scalars import defer_scalar
from .capturable_wrappers import unsupported_wrapper
from .distributed_step import DistributedStep
from .graph_cache import EAGER, GraphCache
from .module_walk import ModuleWalk
from .optim_internals import (accumulative_counts, count_backward, scale_update_param,
                              set_takes_scaler_tensors, takes_scaler_tensors)

__all__ = ["StepGraphs"]

_CLIP_FUNCS = (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_)
# metainfo that a training step turns into Python numbers (baked into a graph): anchors'
# validity, proposal clipping and box decoding read the image's shape
TRAIN_META_KEYS = ("img_shape", "pad_shape", "batch_input_shape")
_NOT_BAKED = ("params", "lr", "initial_lr", "foreach", "fused", "capturable")
_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
_MIN_IGNORED_CAPACITY = 32  # (ignored gts are few: DOTA's difficult objects)


def gt_capacity(counts, minimum: int) -> int:
    """The padded gt count of a batch: a power of two, so that few graphs serve all batches."""
    most = max(max(counts, default=0), minimum, 1)
    return 1 << (most - 1).bit_length()


def step_body(model: nn.Module, inputs: torch.Tensor, samples: list, optim_wrapper,
              distributed: Optional[DistributedStep] = None):
    """One training step as a graph captures it: mmengine's train_step and update_params
    (AmpOptimWrapper's loss scaling included), clipping without reading the norm, and the
    wrapper's non-finite guard where it has one (the calls its eager step makes); with
    `distributed`, the gradients averaged over its processes before anything reads them, as
    DDP's backward does. Returns the log names, their values stacked (then the gradient norm,
    when clipped, and the guard's flag, when guarded), the message hub key of the norm (None
    without clipping) and whether the flag is there."""
    optimizer = optim_wrapper.optimizer
    scaler = getattr(optim_wrapper, "loss_scaler", None)  # AmpOptimWrapper's GradScaler
    guard = getattr(optim_wrapper, "nonfinite_guard", None)  # (RedetOptimWrapper's)
    kwargs = dict(inputs=inputs, data_samples=samples, mode="loss")
    with optim_wrapper.optim_context(model):  # (a guarded wrapper copies the BN statistics)
        losses = model(**kwargs) if distributed is None else distributed.forward(model, **kwargs)
    loss, log_vars = model.parse_losses(losses)
    if guard is not None:
        guard.check_loss(loss)
    scaled = loss if scaler is None else scaler.scale(loss)
    if distributed is None:
        scaled.backward()
    else:
        distributed.backward(scaled)
    values = [v.detach().float() for v in log_vars.values()]
    clip = (lambda: _clip(optim_wrapper)) if optim_wrapper.clip_grad_kwargs else None
    update = scale_update_param(optim_wrapper) if scaler is not None else None
    flag = None
    if guard is not None:
        norm, flag = guard.step(optimizer, clip, scaler, update)
    else:
        if clip is not None and scaler is not None:
            scaler.unscale_(optimizer)
        norm = clip() if clip is not None else None
        if scaler is None:
            optimizer.step()
        else:  # (fused SGD takes the inf check on the device: no read-back)
            scaler.step(optimizer)
            scaler.update(update)
    optimizer.zero_grad(set_to_none=True)
    values += [t.detach().float() for t in (norm, flag) if t is not None]
    norm_key = None if norm is None else f"train/{optim_wrapper.grad_name}"
    return list(log_vars), torch.stack(values), norm_key, flag is not None


class _StepGraph:
    """One captured step: static inputs, the graph, the log values it leaves."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, samples: list,
                 optim_wrapper: OptimWrapper, capacity: tuple, pool,
                 distributed: Optional[DistributedStep]):
        self.capacity = capacity  # (gts, ignored gts) per image
        self.inputs = inputs.clone()
        self.samples = [_padded_sample(s, capacity) for s in samples]
        optimizer = optim_wrapper.optimizer
        self.lrs = _lr_tensors(optimizer, inputs.device)
        # the capture's backward must make new gradients (in the graph's pool), not accumulate
        # into tensors that the eager steps made and later free
        optimizer.zero_grad(set_to_none=True)
        _start_momentum(optimizer)
        self.graph = torch.cuda.CUDAGraph()
        with _device_lr(optimizer, self.lrs), capture_graph(self.graph, pool):
            self.names, self.values, self.norm_key, flagged = step_body(
                model, self.inputs, self.samples, optim_wrapper, distributed)
        self.guard = optim_wrapper.nonfinite_guard if flagged else None

    def replay(self, inputs: torch.Tensor, samples: list, optimizer) -> dict:
        self.inputs.copy_(inputs)
        for static, sample in zip(self.samples, samples):
            for field, padded in _padded_instances(sample, self.capacity).items():
                _copy_fields(static.get(field), padded)
        for lr, group in zip(self.lrs, optimizer.param_groups):
            lr.fill_(group["lr"])
        self.graph.replay()
        # a copy: the next replay overwrites the graph's values while the logger may keep these
        return _log_vars(self.names, self.values.clone(), self.norm_key, self.guard)


def _log_vars(names: list, values: torch.Tensor, norm_key: Optional[str], guard) -> dict:
    """The log values of step_body's results: the guard's flag handed to the guard, the
    gradient norm deferred to the message hub."""
    values = values.unbind()
    if guard is not None:
        guard.record(values[-1])
        values = values[:-1]
    if norm_key is not None:
        defer_scalar(norm_key, values[-1])
    return dict(zip(names, values))


def _warmup_step(model: nn.Module, inputs: torch.Tensor, samples: list, optim_wrapper,
                 capacity: tuple) -> dict:
    """An eager warm-up step that computes as a replay of its graph will: gts padded to the
    capacity, lr read from float32 device tensors, fused SGD (or capturable Adam). The same
    kernels then draw the same random numbers (the R-CNN samplers') from the generator as a
    replay, so a resumed run, whose first steps are warm-up steps again, continues with the
    numbers of the uninterrupted run's replays."""
    optimizer = optim_wrapper.optimizer
    padded = [_padded_sample(s, capacity) for s in samples]
    lrs = _lr_tensors(optimizer, inputs.device)
    # (torch's fused SGD makes missing momentum buffers uninitialised, and a step skipped by
    # the inf check leaves them so)
    _start_momentum(optimizer)
    with _device_lr(optimizer, lrs):
        names, values, norm_key, flagged = step_body(model, inputs, padded, optim_wrapper)
    return _log_vars(names, values, norm_key, optim_wrapper.nonfinite_guard if flagged else None)


class StepGraphs(GraphCache):
    """The captured training steps of one model; `train_step` returns None where eager runs.

    Args:
        max_graphs: graphs kept at most (each batch layout that differs in input shape,
            metainfo or gt capacity needs its own).
        warmup_iters: eager steps of each layout before its capture (a layout that differs
            from an earlier one in gt capacity alone shares its warm-up).
        min_gt_capacity: the smallest padded gt count.
    """

    option = "cuda_graph_step"

    def __init__(self, max_graphs: int = 4, warmup_iters: int = 2, min_gt_capacity: int = 64):
        super().__init__(max_graphs=max_graphs, warmup_iters=warmup_iters,
                         min_gt_capacity=min_gt_capacity)

    def train_step(self, model: nn.Module, inputs: torch.Tensor, samples: list,
                   optim_wrapper, distributed: Optional[DistributedStep] = None
                   ) -> Optional[dict]:
        """One step on preprocessed inputs; the log values, or None: run the eager step.
        With `distributed`, every process of its group calls this at each step (they agree on
        what all of them do) and the graph averages the gradients over them."""
        walk = ModuleWalk(model)
        reason = self.unsupported(inputs, optim_wrapper, walk)
        capacity = (gt_capacity([len(s.gt_instances) for s in samples], self.min_gt_capacity),
                    gt_capacity([len(s.get("ignored_instances", ())) for s in samples],
                                 _MIN_IGNORED_CAPACITY))
        if distributed is not None:
            capacity = distributed.agree_capacity(capacity)
        if reason is not None:
            self.say_eager(reason, inputs.is_cuda)
            if distributed is not None:
                distributed.agree_action(EAGER)
            return None
        optimizer = optim_wrapper.optimizer
        # a new gt capacity alone needs no warm-up: the convolutions' shapes are set up
        warmup_key = (tuple(inputs.shape), inputs.dtype, inputs.device,
                      tuple(_meta_key(s) for s in samples), walk.state_key(), _hyper_key(optimizer))
        key = warmup_key + (capacity,)
        graph = self.graph_for(
            key, walk.storage_key() + _state_storage(optimizer),
            lambda: ModuleWalk(model).storage_key() + _state_storage(optimizer),
            self.warmup_iters, "batch layouts (input shape, image shapes, gt capacity)",
            f"a training step: inputs {tuple(inputs.shape)}, up to {capacity[0]} gts and "
            f"{capacity[1]} ignored gts per image",
            lambda pool: _StepGraph(model, inputs, samples, optim_wrapper, capacity, pool,
                                    distributed),
            # (gradients the failed capture made)
            on_failure=lambda: optimizer.zero_grad(set_to_none=True), warmup_key=warmup_key,
            agree=None if distributed is None else _agreement(distributed, key))
        if distributed is not None and distributed.mismatch:
            self.say("eager: the processes' batches differ in layout (input shape or image "
                     "shapes); a captured collective must be the same step in all of them")
        if graph is None:
            if not (self.warming_up and distributed is None):
                return None
            # (with several processes the model's eager step: its DDP all-reduce is the one
            # every process runs, whichever of them is warming up)
            log_vars = _warmup_step(model, inputs, samples, optim_wrapper, capacity)
        else:
            log_vars = graph.replay(inputs, samples, optimizer)
        count_backward(optim_wrapper)  # (what the eager backward counts)
        return log_vars

    def unsupported(self, inputs: torch.Tensor, optim_wrapper, walk: ModuleWalk):
        """Why a graph cannot serve this step, or None."""
        if self.failed is not None:
            return self.failed
        wrapper_reason = unsupported_wrapper(optim_wrapper)
        if wrapper_reason is not None:
            return wrapper_reason
        if type(optim_wrapper) is AmpOptimWrapper and \
                type(optim_wrapper.optimizer) is not torch.optim.SGD:
            return (f"AmpOptimWrapper with {type(optim_wrapper.optimizer).__name__}: only SGD "
                    "(as fused SGD) takes the loss scaler's inf check on the device "
                    "(RedetAmpOptimWrapper keeps it there with SGD, Adam and AdamW)")
        optimizer = optim_wrapper.optimizer
        if isinstance(optimizer, torch.optim.SGD) and \
                any(g["dampening"] != 0 for g in optimizer.param_groups) and \
                _missing_momentum(optimizer):
            return ("SGD with dampening before its first step (that step makes the momentum "
                    "buffers; a graph cannot)")
        if accumulative_counts(optim_wrapper) != 1:
            return "gradient accumulation (accumulative_counts > 1)"
        if type(optim_wrapper.optimizer) not in _OPTIMIZERS:
            return (f"{type(optim_wrapper.optimizer).__name__}: only SGD, Adam and AdamW steps "
                    "are captured")
        if optim_wrapper.clip_grad_kwargs:
            if optim_wrapper.clip_func not in _CLIP_FUNCS:
                return f"gradient clipping by {optim_wrapper.clip_func!r}"
            if optim_wrapper.clip_grad_kwargs.get("error_if_nonfinite", False):
                return "clip_grad error_if_nonfinite=True reads the norm on the host"
        if walk.has_collectives():
            return "SyncBatchNorm communicates in its forward"
        if not inputs.is_cuda:
            return "the inputs are not on a CUDA device"
        if torch.cuda.is_current_stream_capturing():
            return "a capture is in progress"
        return None


def _agreement(distributed: DistributedStep, key: tuple):
    """GraphCache.graph_for's `agree` for the processes of `distributed`: their keys compared
    without the device (each process has its own)."""
    shared = tuple(part for part in key if not isinstance(part, torch.device))
    return lambda action: distributed.agree_action(action, shared)


def _lr_tensors(optimizer, device) -> list:
    """Each param group's lr as the float32 device tensor _device_lr hands the optimizer."""
    return [torch.tensor(float(g["lr"]), dtype=torch.float32, device=device)
            for g in optimizer.param_groups]


class _device_lr:
    """During the capture, the param groups read lr from device tensors. SGD: torch's fused
    kernel takes a float32 device lr (the foreach step would read it back on the host). Adam,
    AdamW: their capturable step, which keeps its step counts on the device; it stays on after
    the capture (the eager step without it reads every count back)."""

    def __init__(self, optimizer, lrs):
        self.optimizer, self.lrs = optimizer, lrs

    def __enter__(self):
        groups = self.optimizer.param_groups
        self.saved = [(g["lr"], g.get("foreach"), g.get("fused")) for g in groups]
        self.amp_scaling = takes_scaler_tensors(self.optimizer)
        if isinstance(self.optimizer, torch.optim.SGD):
            # (what torch sets for an SGD made with fused=True)
            set_takes_scaler_tensors(self.optimizer, True)
        for group, lr in zip(groups, self.lrs):
            group["lr"] = lr
            if isinstance(self.optimizer, torch.optim.SGD):
                group.update(foreach=False, fused=True)
            else:
                group["capturable"] = True
                for p in group["params"]:
                    state = self.optimizer.state.get(p, {})
                    if isinstance(state.get("step"), torch.Tensor):
                        state["step"] = state["step"].to(lr.device, torch.float32)

    def __exit__(self, *exc):
        for group, (lr, foreach, fused) in zip(self.optimizer.param_groups, self.saved):
            group.update(lr=lr, foreach=foreach, fused=fused)
        set_takes_scaler_tensors(self.optimizer, self.amp_scaling)


def _missing_momentum(optimizer) -> list:
    """The parameters of an SGD with momentum whose buffers no step has made yet."""
    if not isinstance(optimizer, torch.optim.SGD):
        return []
    return [p for g in optimizer.param_groups if g["momentum"] != 0 for p in g["params"]
            if p.requires_grad and optimizer.state.get(p, {}).get("momentum_buffer") is None]


def _start_momentum(optimizer) -> None:
    """SGD's momentum buffers, made before a capture where no step made them yet (the eager
    steps before it were all skipped by AMP's inf check). Torch's first SGD step makes them
    inside the step and tells its kernel so: captured, every replay would run as a first step
    (no momentum), and a first replay skipped by the inf check would leave them uninitialised
    for the later graphs. A zero buffer gives the first step's result, grad, when dampening
    is 0 (unsupported() sends the other case eager)."""
    for p in _missing_momentum(optimizer):
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(
            p, memory_format=torch.preserve_format)


def _clip(optim_wrapper) -> Optional[torch.Tensor]:
    """mmengine's OptimWrapper._clip_grad without its float() of the norm."""
    if not optim_wrapper.clip_grad_kwargs:
        return None
    params = [p for g in optim_wrapper.optimizer.param_groups for p in g["params"]
              if p.requires_grad and p.grad is not None]
    if not params:
        return None
    return optim_wrapper.clip_func(params, **optim_wrapper.clip_grad_kwargs)


def _padded_instances(sample, capacity: tuple) -> dict:
    """The sample's gt_instances and ignored_instances (when it has boxes) padded to the
    capacities (gts, ignored gts)."""
    padded = dict(gt_instances=pad_gt_instances(sample.gt_instances, capacity[0]))
    ignored = sample.get("ignored_instances", None)
    if ignored is not None and "bboxes" in ignored:
        padded["ignored_instances"] = pad_gt_instances(ignored, capacity[1])
    return padded


def _padded_sample(sample, capacity: tuple):
    """A copy of a data sample with padded instances (the graph's static gts: each replay
    copies the next batch's gts into them)."""
    static = sample.clone()
    for field, padded in _padded_instances(sample, capacity).items():
        setattr(static, field, padded)
    return static


def _copy_fields(static: InstanceData, new: InstanceData) -> None:
    for key, value in static.items():
        _tensor(value).copy_(_tensor(new[key]))


def _tensor(value):
    return value.tensor if hasattr(value, "tensor") else value  # (mmdet box types)


def _meta_key(sample) -> tuple:
    return tuple(hashable(sample.metainfo.get(k)) for k in TRAIN_META_KEYS)


def hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if hasattr(value, "tolist"):  # numpy scale factors
        return hashable(value.tolist())
    return value


def _hyper_key(optimizer) -> tuple:
    """The param groups' settings that a graph bakes in (lr is read from the device)."""
    return tuple(tuple(sorted((k, hashable(v)) for k, v in g.items() if k not in _NOT_BAKED))
                 for g in optimizer.param_groups)


def _state_storage(optimizer) -> tuple:
    return tuple(t.data_ptr() for state in optimizer.state.values() for t in state.values()
                 if isinstance(t, torch.Tensor))
