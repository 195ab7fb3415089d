"""The one way redet_plugin registers a component in an OpenMMLab registry.

Every component is registered under "Redet" + its class name (RoIPool -> 'RedetRoIPool',
DOTADataset -> 'RedetDOTADataset'), so no name can collide with one of mmcv, mmdet or mmrotate:
a collision would break the other project's import or silently swap its class for ours.

`importlib.reload` (or a second copy of a module loaded under the same name) re-runs the
decorators; mmengine then refuses because the name is taken. A class coming back (same module
and qualified name) replaces its own entry; any other holder of the name is still an error.
"""
from mmengine.registry import Registry

NAME_PREFIX = "Redet"


def registered_name(cls: type) -> str:
    return NAME_PREFIX + cls.__name__


def _same_class(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(registry: Registry):
    """Class decorator: `@register(MODELS)` registers the class as 'Redet<ClassName>'."""
    def decorate(cls: type) -> type:
        name = registered_name(cls)
        existing = registry.module_dict.get(name)
        reimport = existing is not None and _same_class(existing, cls)
        registry.register_module(name=name, module=cls, force=reimport)
        return cls
    return decorate
