"""Registering into mmdet's registries in a way that survives re-imports.

`importlib.reload` (or a second copy of a module loaded under the same name) re-runs the
`register_module` decorators; mmengine then refuses because the name is taken. `register_once`
replaces an entry only when it is the same class (same module and qualified name) coming back,
and still raises on a genuine clash with another package's class of the same name.
"""
from typing import Optional

from mmdet.registry import MODELS
from mmengine.registry import Registry


def _same_class(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register_once(registry: Registry = MODELS, name: Optional[str] = None):
    """Class decorator: `@register_once()` registers the class in mmdet's MODELS under its name."""
    def decorate(cls: type) -> type:
        key = name or cls.__name__
        existing = registry.module_dict.get(key)
        reimport = existing is not None and _same_class(existing, cls)
        registry.register_module(name=key, module=cls, force=reimport)
        return cls
    return decorate
