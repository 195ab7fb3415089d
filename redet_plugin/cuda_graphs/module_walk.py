"""The modules, parameters and buffers a CUDA graph reads in place, listed once per call."""
from torch import nn

__all__ = ["ModuleWalk"]


class ModuleWalk:
    """One walk over a net: each modules()/parameters()/buffers() walk is a pass over hundreds
    of modules, so a graph's keys are built from this one listing."""

    def __init__(self, net: nn.Module):
        self.modules = list(net.modules())
        self.params = [p for m in self.modules for p in m._parameters.values() if p is not None]
        self.buffers = [b for m in self.modules for b in m._buffers.values() if b is not None]
        # tensors read in place that are not buffers (CachedFilterR2Conv's eval-mode filters);
        # looked up on the class: hasattr on a module without it raises inside nn.Module's
        # __getattr__, which for hundreds of modules costs more than the rest of the walk
        self.buffers += [t for m in self.modules if getattr(type(m), "cached_tensors", None)
                         for t in m.cached_tensors()]

    def state_key(self) -> tuple:
        return (tuple(m.training for m in self.modules),
                tuple(p.requires_grad for p in self.params))

    def storage_key(self) -> tuple:
        """The tensors a graph reads in place: a replaced one needs a new capture."""
        return tuple((t.data_ptr(), t.dtype) for t in (*self.params, *self.buffers))

    def has_collectives(self) -> bool:
        # SyncBatchNorm communicates in its forward: not captured
        return any(isinstance(m, nn.SyncBatchNorm) for m in self.modules)
