"""Pictures of rotated boxes: an mmdet visualizer that draws RotatedBoxes (tools/test.py
--show-dir, tools/infer.py, tools/analysis_tools/browse_dataset.py)."""
from .rotated_visualizer import RotatedDetLocalVisualizer

__all__ = ['RotatedDetLocalVisualizer']
