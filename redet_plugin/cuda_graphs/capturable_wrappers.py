"""The optim wrappers whose update a captured training step may stand in for.

The captured step (step_graphs.step_body) is mmengine's OptimWrapper.update_params (with
AmpOptimWrapper's loss scaling): a wrapper that changes its backward, clipping or step would be
bypassed. mmengine's two wrappers are known; a subclass that changes only what the captured step
does itself (e.g. how the gradient norm is logged) says so with `@capturable_optim_wrapper`,
which keeps this layer free of imports from the wrappers' own (engine/). Subclasses of a
marked class are not marked: they may change more.
"""
from typing import Optional

from mmengine.optim import AmpOptimWrapper, OptimWrapper

from ..utils.registration import registered_name

__all__ = ["capturable_optim_wrapper", "unsupported_wrapper"]

_MARKED = []  # the classes marked with capturable_optim_wrapper, in order


def capturable_optim_wrapper(cls: type) -> type:
    """Class decorator: steps of this exact optim wrapper class may be captured."""
    if not issubclass(cls, OptimWrapper):
        raise TypeError(f"capturable_optim_wrapper: {cls.__name__} is not an mmengine "
                        "OptimWrapper")
    # (a reloaded module's class replaces its earlier self)
    _MARKED[:] = [c for c in _MARKED
                  if (c.__module__, c.__qualname__) != (cls.__module__, cls.__qualname__)]
    _MARKED.append(cls)
    return cls


def unsupported_wrapper(optim_wrapper) -> Optional[str]:
    """Why a captured step cannot stand in for this wrapper's update, or None."""
    if type(optim_wrapper) in (OptimWrapper, AmpOptimWrapper, *_MARKED):
        return None
    names = ["mmengine's OptimWrapper", "AmpOptimWrapper"] + [registered_name(c) for c in _MARKED]
    return f"{type(optim_wrapper).__name__}: only {' and '.join(names)} are captured"
