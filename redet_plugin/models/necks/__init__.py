from .re_fpn import ReFPN  # noqa: F401
