"""Backbone + neck replayed as CUDA graphs (ReDet's `cuda_graph_features` option).

A training step of the equivariant backbone is bound by the host, not the GPU: e2cnn's filter
expansion, the field norms and the convs are hundreds of small launches from Python, forward and
backward. Captured once as CUDA graphs, a step replays them with one launch each way: with grad
a forward graph and a backward graph of the trainable parameters' gradients (as
torch.cuda.make_graphed_callables makes them, but returning copies of the gradients), without
grad a forward graph. The graphs run the eager modules' kernels, so the results are theirs.

One graph (or forward/backward pair) per input shape and dtype, autocast dtype, grad and
inference mode and module state (train/eval of every submodule, requires_grad of every
parameter), up to `max_graphs`. Wherever a graph cannot serve, the eager modules run: input not
on CUDA or requiring grad, a capture or torch.compile in progress, SyncBatchNorm inside, (with
grad) no trainable parameter, a second forward while the backward of the graph's last replay is
still to come, and, with one line in the log naming why, past `max_graphs` and after a capture
that failed (from then on). A graph reads the parameters and buffers in place; when one of them
is replaced (`.half()`, `.to()`, a new eval-mode filter cache after `train()`), its graph is
captured again.

A capture runs the modules a few times on the batch it is given (warm-up); the buffers those runs
change (batch-norm running statistics, batches tracked) are put back, so the first replay updates
them exactly once, as the eager step would. The features returned are copies: the graph's own
outputs are overwritten by its next replay.
"""
import weakref

import torch
from torch import nn

from ..utils.cuda_capture import capture_graph, on_capture_stream
from .graph_cache import GraphCache
from .module_walk import ModuleWalk

__all__ = ["FeatureGraphs"]


class _FeatureNet(nn.Module):
    """backbone then neck as one module (the graphed callable; throwaway, not in any state_dict)."""

    def __init__(self, backbone: nn.Module, neck: nn.Module):
        super().__init__()
        self.backbone, self.neck = backbone, neck

    def forward(self, x):
        feats = self.backbone(x)
        return tuple(feats if self.neck is None else self.neck(feats))


def _autocast_dtype():
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None


class _ForwardGraph:
    """A forward-only graph (no grad): static input, replay, copies of the outputs."""

    def __init__(self, net: nn.Module, x: torch.Tensor, warmup: int):
        self.input = x.clone()
        with on_capture_stream():
            for _ in range(warmup):  # cuDNN/cuBLAS set-up and lazy caches, outside the capture
                net(self.input)
        self.graph = torch.cuda.CUDAGraph()
        with capture_graph(self.graph):
            self.outputs = net(self.input)

    def busy(self) -> bool:
        return False  # (no backward to wait for)

    def __call__(self, x: torch.Tensor) -> tuple:
        self.input.copy_(x)
        self.graph.replay()
        return tuple(o.clone() for o in self.outputs)


class _Replay(torch.autograd.Function):
    """The training graphs' forward and backward as one autograd node."""

    @staticmethod
    def forward(ctx, graph, x, *params):
        graph.input.copy_(x)
        graph.forward_graph.replay()
        graph.replays += 1
        ctx.graph, ctx.replay = graph, graph.replays
        return tuple(o.clone() for o in graph.outputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outputs):
        graph = ctx.graph
        if ctx.replay != graph.replays:
            raise RuntimeError(
                "cuda_graph_features: backward through backbone features of an earlier step "
                "after the graph was replayed again (its activations are gone); run that "
                "backward before the next forward, or set cuda_graph_features=False")
        for static, grad in zip(graph.grad_outputs, grad_outputs):
            static.copy_(grad)
        graph.backward_graph.replay()
        graph.backward_ran = True
        # copies: autograd may keep a returned gradient as param.grad and add the next one into it
        return (None, None, *(None if g is None else g.clone() for g in graph.grads))


class _TrainingGraph:
    """A forward graph and its backward graph (gradients of the trainable parameters). A replay's
    backward reads activations that the next replay overwrites: while one is still to come,
    `busy()` is true (the caller then runs eagerly), and a backward through an older replay
    raises."""

    def __init__(self, net: nn.Module, x: torch.Tensor, warmup: int):
        named = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
        self.params = tuple(p for _, p in named)
        self.input = x.clone()
        # The graphs differentiate with respect to aliases of the parameters (same storage, new
        # autograd leaves). A parameter's own gradient accumulator can belong to another stream:
        # DDP keeps the ones it made at construction, on the default stream, and a capture that
        # accumulated into them would make the default stream wait on the capturing one (an error).
        aliases = {name: p.detach().requires_grad_(True) for name, p in named}
        leaves = tuple(aliases.values())

        def forward():
            return tuple(torch.func.functional_call(net, aliases, (self.input,)))

        def backward_of(outputs, grad_outputs):
            return torch.autograd.grad(outputs, leaves, grad_outputs, allow_unused=True)

        with on_capture_stream():
            for _ in range(warmup):  # cuDNN/cuBLAS set-up, outside the capture
                outputs = forward()
                backward_of(outputs, [torch.ones_like(o) for o in outputs])
            # Warm-up outputs kept alive would keep their activations beside the graphs' pool,
            # and the aliases' gradient accumulators of the warm-up, which the capture would
            # reuse (torch warns when an accumulator's stream differs from its producer's).
            del outputs
        # one pool for this forward and its backward: the backward reads the forward's
        # activations; graphs of other keys may replay in between, so they get pools of their own
        pool = torch.cuda.graph_pool_handle()
        self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with capture_graph(self.forward_graph, pool):
            self.outputs = forward()
        self.grad_outputs = tuple(torch.empty_like(o) for o in self.outputs)
        with capture_graph(self.backward_graph, pool):
            self.grads = backward_of(self.outputs, self.grad_outputs)
        self.outputs = tuple(o.detach() for o in self.outputs)
        self.replays, self.backward_ran, self._last_node = 0, True, lambda: None

    def busy(self) -> bool:
        return self._last_node() is not None and not self.backward_ran

    def __call__(self, x: torch.Tensor) -> tuple:
        outputs = _Replay.apply(self, x, *self.params)
        self.backward_ran, self._last_node = False, weakref.ref(outputs[0].grad_fn)
        return outputs


class FeatureGraphs(GraphCache):
    """The graphs of one detector's backbone + neck; `__call__` returns None where eager must run.

    Args:
        max_graphs: graphs kept at most (each holds its own memory for activations); inputs of
            other shapes or states run eagerly.
        warmup: eager runs before each capture.
    """

    option = "cuda_graph_features"
    shared_pool = False  # (a training graph's backward may follow other graphs' replays)

    def __init__(self, max_graphs: int = 2, warmup: int = 3):
        super().__init__(max_graphs=max_graphs, warmup=warmup)

    def __call__(self, backbone: nn.Module, neck, x: torch.Tensor):
        if self.failed is not None or not self._usable(x):
            return None
        net = _FeatureNet(backbone, neck)
        walk = ModuleWalk(net)
        with_grad = torch.is_grad_enabled()
        if with_grad and not any(p.requires_grad for p in walk.params):
            return None
        if walk.has_collectives():
            return None
        amp_dtype = _autocast_dtype()
        key = (tuple(x.shape), x.dtype, x.device, with_grad, torch.is_inference_mode_enabled(),
               amp_dtype, walk.state_key())
        # (no eager calls before a capture: each capture warms up on its first batch)
        graph = self.graph_for(
            key, walk.storage_key(), lambda: ModuleWalk(net).storage_key(), 0,
            "input layouts (shape, dtype, grad mode, autocast, module state)",
            f"backbone + neck: inputs {tuple(x.shape)}, {'with' if with_grad else 'no'} grad",
            lambda _no_pool: self._capture(net, walk.buffers, x, with_grad, amp_dtype))
        if graph is None or graph.busy():
            return None  # (busy: a second forward before the first one's backward)
        with self._autocast(amp_dtype):
            return graph(x)

    @staticmethod
    def _usable(x: torch.Tensor) -> bool:
        return (isinstance(x, torch.Tensor) and x.is_cuda and not x.requires_grad
                and not torch.cuda.is_current_stream_capturing()
                and not torch.compiler.is_compiling())

    @staticmethod
    def _autocast(amp_dtype):
        # autocast's weight cache would keep casts made during the capture: casts are captured
        return torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None,
                              cache_enabled=False)

    def _capture(self, net: nn.Module, buffers: list, x: torch.Tensor, with_grad: bool,
                 amp_dtype):
        saved = [b.clone() for b in buffers]
        try:
            with self._autocast(amp_dtype):
                return (_TrainingGraph if with_grad else _ForwardGraph)(net, x, self.warmup)
        finally:
            # undo the warm-up runs' updates (running statistics), also where the capture
            # failed: the eager step that runs instead updates them once
            with torch.no_grad():
                for b, s in zip(buffers, saved):
                    b.copy_(s)
