"""Run an exported ReDet (tools/export.py) with torch and redet_plugin.ops only: no mmengine,
mmdet, mmcv or e2cnn.

    import cv2
    from redet_plugin.deploy import load
    detector = load('redet.pt2')            # or load('redet.pt2', device='cuda:1')
    found = detector(cv2.imread('P0006.png'))
    found.boxes, found.scores, found.labels, found.class_names, found.polygons
"""
from .compatibility import PackageMismatchError
from .deployed_detector import DeployedDetections, DeployedDetector, load
from .package_format import NotAPackageError, read_metadata
from .polygons import rbox_corners

__all__ = ['load', 'DeployedDetector', 'DeployedDetections', 'NotAPackageError',
           'PackageMismatchError', 'read_metadata', 'rbox_corners']
