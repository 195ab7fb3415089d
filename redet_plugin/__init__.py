"""redet_plugin: rotated object detection for the OpenMMLab stack.

Two layers. `redet_plugin.ops` (the compiled kernels and their Python faces) needs only torch.
`redet_plugin.mm` registers the models, datasets, transforms and metric in mmdet's registries.
Importing this package alone loads neither, unless mmengine is already loaded: then the caller is
an OpenMMLab program (e.g. a config's `custom_imports=dict(imports=['redet_plugin'])`), and the mm
layer is loaded too.
"""
import sys

from .version import __version__  # noqa: F401

if "mmengine" in sys.modules:
    from . import mm  # noqa: F401
