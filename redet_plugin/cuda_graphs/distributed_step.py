"""What a training step captured in several processes needs beyond one process's step.

DDP averages the gradients with its reducer, autograd hooks that bucket them and launch their
all-reduces during the backward; a CUDA graph cannot capture those (the reducer decides on the
host, as the gradients come). Captured, the step instead differentiates, then averages all the
gradients with one all-reduce of one flat tensor per dtype: NCCL collectives can be captured,
and the graph's replay runs it with the rest of the step. The result is DDP's (each process's
gradients summed, divided by the number of processes; as DDP, the division comes first).

The gradients are taken with respect to aliases of the parameters (same storage, new autograd
leaves), as FeatureGraphs does: DDP keeps the parameters' own gradient accumulators, made on the
default stream when it was built, and a capture that accumulated into them would make the
default stream wait on the capturing one (an error).

The processes must also take the same action at the same time: NCCL requires a captured
collective to be captured by all the processes at once and each replay to be of graphs from that
same capture. So before each step the processes agree, over a gloo group on the host (no GPU
read-back), on the gt capacity (the largest of theirs) and on the action (GraphCache.graph_for's
`agree`): where their batch layouts differ, all run eagerly.
"""
import zlib
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .graph_cache import EAGER

__all__ = ["DistributedStep"]


class DistributedStep:
    """The gradient averaging and the agreements of a step captured in `process_group`'s
    processes. Made by every process of the group at the same point (it makes a gloo group
    of the same processes, a collective call)."""

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        self.host_group = dist.new_group(ranks=ranks, backend="gloo")
        self._params: Optional[list] = None
        self._leaves: Optional[list] = None
        self.mismatch = False  # set when the last agree_action found different layouts

    def forward(self, model: nn.Module, **kwargs):
        """model(**kwargs) with its trainable parameters as aliases (backward() differentiates
        with respect to them)."""
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._params = [p for _, p in named]
        aliases = {name: p.detach().requires_grad_(True) for name, p in named}
        self._leaves = list(aliases.values())
        return torch.func.functional_call(model, aliases, (), kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Sets every trainable parameter's .grad to the processes' average gradient of `loss`.
        A parameter without a gradient here adds zeros to the all-reduce (every process must
        reduce as many elements) and keeps no gradient, as DDP leaves one that no process used
        (the processes run the same model: what one leaves unused, all do)."""
        params, leaves = self._params, self._leaves
        if params is None:
            raise RuntimeError("DistributedStep.backward without a forward() before it")
        self._params = self._leaves = None
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        by_dtype = {}
        for p, g in zip(params, grads):
            by_dtype.setdefault(p.dtype, []).append((p, g))
        for pairs in by_dtype.values():
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                              for p, g in pairs])
            flat.div_(self.world_size)
            dist.all_reduce(flat, group=self.process_group)
            for (p, g), part in zip(pairs, flat.split([p.numel() for p, _ in pairs])):
                if g is None:
                    p.grad = None
                    continue
                grad = torch.empty_like(p)  # (the parameter's strides: channels-last stays)
                grad.copy_(part.view(p.shape))
                p.grad = grad

    def agree_capacity(self, capacity: tuple) -> tuple:
        """The largest of the processes' gt capacities (one graph key for all)."""
        agreed = torch.tensor(capacity, dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.host_group)
        return tuple(agreed.tolist())

    def agree_action(self, action: int, key=None) -> int:
        """The least of the processes' actions (GraphCache: EAGER, CAPTURE, REPLAY); EAGER
        where their keys differ (`key`'s repr, without the device, which is each process's
        own)."""
        digest = zlib.crc32(repr(key).encode())
        votes = torch.tensor([action, digest, -digest], dtype=torch.int64)
        dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=self.host_group)
        least, low, minus_high = votes.tolist()
        self.mismatch = least != EAGER and low != -minus_high
        return EAGER if self.mismatch else least
