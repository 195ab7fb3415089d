"""CUDA-graph replay of model parts (mm layer): FeatureGraphs replays a detector's backbone + neck."""
from .feature_graphs import FeatureGraphs

__all__ = ["FeatureGraphs"]
