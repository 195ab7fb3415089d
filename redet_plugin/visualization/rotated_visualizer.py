"""RotatedDetLocalVisualizer: mmdet's DetLocalVisualizer that draws rotated boxes as polygons.

Use it in a config as `visualizer=dict(type='RedetRotatedDetLocalVisualizer', ...)`; tools/test.py
`--show-dir` and tools/analysis_tools/browse_dataset.py then draw RotatedBoxes. Horizontal boxes
and masks are drawn by the parent class.
"""
from typing import List, Optional

import numpy as np
import torch
from mmdet.registry import VISUALIZERS
from mmdet.visualization import DetLocalVisualizer
from mmdet.visualization.palette import _get_adaptive_scales, get_palette
from mmengine.structures import InstanceData

from redet_plugin.utils.registration import register

from ..structures import RotatedBoxes, rbox2qbox


def _rotated_tensor(bboxes) -> Optional[torch.Tensor]:
    """The (N, 5) tensor when `bboxes` are rotated boxes, else None."""
    if isinstance(bboxes, RotatedBoxes):
        return bboxes.tensor
    if isinstance(bboxes, torch.Tensor) and bboxes.dim() == 2 and bboxes.shape[-1] == 5:
        return bboxes
    return None


@register(VISUALIZERS)
class RotatedDetLocalVisualizer(DetLocalVisualizer):
    """Draws rotated boxes (RotatedBoxes or (N, 5) tensors) as polygons labelled `class: score`."""

    def _draw_instances(self, image: np.ndarray, instances: InstanceData, classes: Optional[List[str]],
                        palette: Optional[List[tuple]]) -> np.ndarray:
        rboxes = _rotated_tensor(instances.bboxes) if 'bboxes' in instances else None
        if rboxes is None:
            return super()._draw_instances(image, instances, classes, palette)
        self.set_image(image)
        if len(rboxes) > 0:
            labels = [int(v) for v in instances.labels]
            max_label = max(labels)
            text_palette = get_palette(self.text_color, max_label + 1)
            box_palette = get_palette(palette if self.bbox_color is None else self.bbox_color, max_label + 1)
            corners = rbox2qbox(rboxes.detach().float().cpu()).reshape(-1, 4, 2).numpy()
            self.draw_polygons([c for c in corners], edge_colors=[box_palette[i] for i in labels],
                               alpha=self.alpha, line_widths=self.line_width)
            scales = _get_adaptive_scales((rboxes[:, 2] * rboxes[:, 3]).detach().cpu().numpy())
            for i, label in enumerate(labels):
                text = classes[label] if classes is not None else f'class {label}'
                if 'scores' in instances:
                    text += f': {round(float(instances.scores[i]) * 100, 1)}'
                top_left = corners[i][np.argmin(corners[i][:, 1])]
                self.draw_texts(text, top_left, colors=text_palette[label], font_sizes=int(13 * scales[i]),
                                bboxes=[dict(facecolor='black', alpha=0.8, pad=0.7, edgecolor='none')])
        return self.get_image()
