"""CUDA-graph replay: FeatureGraphs replays a detector's backbone + neck, StepGraphs a whole
training step, PredictGraphs a whole test forward; CudaGraphDetectorMixin gives a detector the
three as config options. Imports torch, mmengine, ops, structures and utils only: never the
models or the engine above it."""
from .capturable_wrappers import capturable_optim_wrapper
from .detector_mixin import CudaGraphDetectorMixin
from .feature_graphs import FeatureGraphs
from .predict_graphs import PredictGraphs
from .step_graphs import StepGraphs

__all__ = ["CudaGraphDetectorMixin", "FeatureGraphs", "PredictGraphs", "StepGraphs",
           "capturable_optim_wrapper"]
