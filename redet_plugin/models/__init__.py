"""Models: backbones, necks, RoI heads, box coders, detectors (registered in mmdet's registries)."""
from . import task_modules  # noqa: F401
from . import roi_heads  # noqa: F401
from . import detectors  # noqa: F401
