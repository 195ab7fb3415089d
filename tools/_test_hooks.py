"""Hooks tools/test.py adds to the Runner: a progress bar and pictures of rotated detections."""
import os
import os.path as osp

import mmcv
from mmengine.hooks import Hook
from mmengine.utils import ProgressBar


class ProgressBarHook(Hook):
    """Shows a progress bar over the test images (on the main process)."""

    def before_test(self, runner) -> None:
        self.bar = ProgressBar(len(runner.test_dataloader.dataset)) if runner.rank == 0 else None

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.bar is not None:
            for _ in outputs or ():
                self.bar.update()

    def after_test(self, runner) -> None:
        if self.bar is not None:
            print()


class RotatedPicturesHook(Hook):
    """Writes each test image with its rotated detections (score >= score_thr) to out_dir."""

    def __init__(self, out_dir: str, score_thr: float = 0.3) -> None:
        self.out_dir, self.score_thr = out_dir, score_thr

    def before_test(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        meta = runner.test_dataloader.dataset.metainfo
        self.classes, self.palette = meta.get('classes'), meta.get('palette')

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        from redet_plugin.visualization import draw_rotated_boxes
        for sample in outputs or ():
            pred = sample.pred_instances
            keep = pred.scores >= self.score_thr
            img = mmcv.imread(sample.img_path)  # BGR, original size: predictions are rescaled
            palette = [tuple(reversed(c)) for c in self.palette] if self.palette else None
            drawn = draw_rotated_boxes(img, pred.bboxes[keep].cpu(), pred.labels[keep].tolist(),
                                       self.classes, pred.scores[keep].tolist(), palette)
            mmcv.imwrite(drawn, osp.join(self.out_dir, osp.basename(sample.img_path)))
