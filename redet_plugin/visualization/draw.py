"""Draws rotated boxes as polygons with class names (and scores) on images, with OpenCV."""
from typing import Optional, Sequence

import cv2
import numpy as np
import torch

from ..structures import rbox2qbox

_DEFAULT_COLOUR = (0, 255, 0)


def draw_rotated_boxes(img: np.ndarray, rboxes, labels: Optional[Sequence[int]] = None,
                       class_names: Optional[Sequence[str]] = None, scores: Optional[Sequence[float]] = None,
                       palette: Optional[Sequence[Sequence[int]]] = None, thickness: int = 1,
                       font_scale: float = 0.35) -> np.ndarray:
    """Returns a copy of `img` (H, W, 3, in the image's channel order) with the boxes drawn.

    rboxes: (N, 5) (cx, cy, w, h, theta) as tensor, array or RotatedBoxes. Colours come from
    `palette[label]` (in the image's channel order) and text is `class [score]`.
    """
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f'draw_rotated_boxes: img must be (H, W, 3), got {img.shape}')
    tensor = getattr(rboxes, 'tensor', rboxes)
    tensor = torch.as_tensor(tensor, dtype=torch.float32).reshape(-1, 5)
    out = np.ascontiguousarray(img.copy())
    corners = rbox2qbox(tensor).reshape(-1, 4, 2).numpy()
    for i, quad in enumerate(corners):
        label = int(labels[i]) if labels is not None else None
        colour = tuple(int(c) for c in palette[label]) if palette is not None and label is not None \
            else _DEFAULT_COLOUR
        cv2.polylines(out, [np.round(quad).astype(np.int32)], True, colour, thickness, cv2.LINE_AA)
        text = []
        if label is not None:
            text.append(class_names[label] if class_names is not None and label < len(class_names)
                        else str(label))
        if scores is not None:
            text.append(f'{float(scores[i]):.2f}')
        if text:
            x, y = quad[:, 0].min(), quad[:, 1].min()
            cv2.putText(out, ' '.join(text), (int(x), max(int(y) - 2, 8)), cv2.FONT_HERSHEY_SIMPLEX,
                        font_scale, colour, 1, cv2.LINE_AA)
    return out
