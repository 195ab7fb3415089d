"""mmdet-registry components; importing this package registers them (one import per module)."""
from . import roi_layers  # noqa: F401
from . import roi_extractors  # noqa: F401
from . import roi_heads  # noqa: F401
