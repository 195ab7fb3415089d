"""redet_plugin: rotated object detection for the OpenMMLab stack.

Importing the package (as `custom_imports=dict(imports=['redet_plugin'])` does) registers every
op, model, dataset, transform and metric in mmdet's registries, and lets mmengine checkpoints
load under torch >= 2.6.
"""
__version__ = "0.1.0"

from .utils.checkpoint_compat import register_checkpoint_safe_globals

register_checkpoint_safe_globals()

from . import ops  # noqa: E402,F401
from . import structures, datasets, evaluation, models, visualization  # noqa: E402,F401
