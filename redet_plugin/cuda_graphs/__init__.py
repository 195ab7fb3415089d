"""CUDA-graph replay (mm layer): FeatureGraphs replays a detector's backbone + neck, StepGraphs
a whole training step, PredictGraphs a whole test forward."""
from .feature_graphs import FeatureGraphs
from .predict_graphs import PredictGraphs
from .step_graphs import StepGraphs

__all__ = ["FeatureGraphs", "PredictGraphs", "StepGraphs"]
