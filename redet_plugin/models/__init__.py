"""Models registered in mmdet's registries (importing this package registers them)."""
from . import flow_projection  # noqa: F401
