"""Registers the model components in mmdet's MODELS registry (one import per subpackage)."""
from . import backbones  # noqa: F401
from . import necks  # noqa: F401
from .equivariant import convert_to_plain  # noqa: F401
