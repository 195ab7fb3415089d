"""Registers the model components in mmdet's registries (one import per subpackage or module)."""
from . import backbones  # noqa: F401
from . import data_preprocessors  # noqa: F401
from . import dense_heads  # noqa: F401
from . import losses  # noqa: F401
from . import necks  # noqa: F401
from . import layers  # noqa: F401
from .layers import convert_to_plain, isolate_e2cnn_bases  # noqa: F401
from . import roi_heads  # noqa: F401
from . import task_modules  # noqa: F401
from . import detectors  # noqa: F401
