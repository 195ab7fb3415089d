"""Pictures of rotated boxes: a cv2 drawing helper and an mmdet visualizer for RotatedBoxes."""
from .draw import draw_rotated_boxes
from .rotated_visualizer import RotatedDetLocalVisualizer

__all__ = ['draw_rotated_boxes', 'RotatedDetLocalVisualizer']
