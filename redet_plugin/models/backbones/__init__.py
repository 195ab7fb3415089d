from .re_resnet import ReResNet  # noqa: F401
