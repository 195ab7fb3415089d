"""RotatedDetector: a config + checkpoint as a detector of images of any size.

    from redet_plugin.inference import RotatedDetector
    detector = RotatedDetector('configs/redet/redet-le90_re50_refpn_1x_dota.py', 'epoch_12.pth',
                               device='cuda')
    result = detector.predict('P0006.png')      # or an array (H, W[, C]) in OpenCV's BGR order
    result.boxes, result.scores, result.labels, result.class_names(), result.polygons()
"""
import os.path as osp
import warnings
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.runner.amp import autocast

from ..structures.padded_results import PendingOutputs, keep_padding
from ..utils.checkpoint_check import CheckpointMismatchError, check_model_classes, load_checked_checkpoint
from .image_source import ImageSource
from .patch_inference import Detections, check_patch_args, detect_by_patches
from .plain_model import make_plain


def default_device() -> str:
    """Where RotatedDetector runs without a `device`: 'cuda' when torch sees a GPU, else 'cpu'."""
    return 'cuda' if torch.cuda.is_available() else 'cpu'


@dataclass
class DetectionResult:
    """The detections of one image, in its pixels.

    boxes: (N, 5) float32 rotated boxes (cx, cy, w, h, theta radians, le90); scores (N,);
    labels (N,) indices into `classes`; by descending score.
    """
    name: str
    height: int
    width: int
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    classes: Tuple[str, ...]

    def __len__(self) -> int:
        return len(self.scores)

    def class_names(self) -> List[str]:
        return [self.classes[int(label)] for label in self.labels]

    def polygons(self) -> np.ndarray:
        """(N, 8) corners x1 y1 ... x4 y4, in DOTA's order."""
        from ..structures import rbox2qbox
        return rbox2qbox(torch.as_tensor(self.boxes, dtype=torch.float32).reshape(-1, 5)).numpy()


class RotatedDetector:
    """A detector built from an mmdet-style config and a checkpoint.

    Args:
        config: config file (or mmengine Config) of the model; its classes are the test (else
            val, train) data set's `metainfo.classes`, else the data set type's defaults.
        checkpoint: weights; None keeps the config's initialisation (for tests).
        device: 'cuda', 'cuda:1', 'cpu'; default: cuda when available.
        patch_size, patch_overlap, scales: the patches (the splitter's grid, at each scale;
            redet_plugin/structures/patch_grid.py); an image no larger than one patch is run whole.
        batch_size: patches per forward pass.
        score_thr: detections scoring lower are dropped.
        merge_iou_thr: IoU of the class-wise rotated NMS that merges the patches' detections.
        plain: run the backbone and neck as plain convolutions with folded batch norms
            (inference/plain_model.py: the same detections up to float rounding, faster);
            False keeps e2cnn's modules.
        amp: run the model under fp16 autocast (mmengine's, as `tools/test.py --amp`); CUDA
            devices only.
    A checkpoint trained on other classes than the config's, or of another model, raises
    CheckpointMismatchError (one line naming the file).
    """

    def __init__(self, config, checkpoint: Optional[str] = None, device: Optional[str] = None,
                 patch_size: int = 1024, patch_overlap: int = 200, scales: Sequence[float] = (1.0,),
                 batch_size: int = 1, score_thr: float = 0.05, merge_iou_thr: float = 0.1,
                 cfg_options: Optional[dict] = None, plain: bool = True,
                 amp: bool = False) -> None:
        self._set_patching(patch_size, patch_overlap, scales, batch_size, score_thr, merge_iou_thr)
        self.device = torch.device(device or default_device())
        if amp and self.device.type != 'cuda':
            raise ValueError(f'amp=True (fp16 autocast) needs a CUDA device; got {self.device}')
        self.amp = bool(amp)
        self.model, self.classes, self.palette = _build_model(config, checkpoint, self.device, cfg_options)
        if plain:
            make_plain(self.model, half=self.amp)

    def _set_patching(self, patch_size, patch_overlap, scales, batch_size, score_thr, merge_iou_thr):
        scales = tuple(float(s) for s in scales)
        check_patch_args(patch_size, patch_overlap, scales, batch_size, score_thr, merge_iou_thr)
        self.patch_size, self.patch_overlap, self.scales = int(patch_size), int(patch_overlap), scales
        self.batch_size, self.score_thr, self.merge_iou_thr = int(batch_size), score_thr, merge_iou_thr

    def predict(self, image: Union[str, np.ndarray, ImageSource], name: Optional[str] = None,
                progress=None) -> DetectionResult:
        """Detections of one image (a path, an array in OpenCV's BGR order, or an ImageSource).
        A missing or unreadable image raises ImageReadError (one line naming it).
        `progress(done, total)` is called after each batch of patches."""
        source = image if isinstance(image, ImageSource) else ImageSource(image, name=name)
        found = detect_by_patches(source, self.predict_patches, self.patch_size, self.patch_overlap,
                                  self.scales, self.batch_size, self.score_thr, self.merge_iou_thr,
                                  progress)
        return DetectionResult(source.name, source.height, source.width, found.boxes, found.scores,
                               found.labels, self.classes)

    @torch.no_grad()
    def predict_patches(self, patches: List[np.ndarray]) -> Sequence[Detections]:
        """The model on equal-sized uint8 (H, W, 3) BGR patches at their size (no resize):
        per patch the detections in its pixels. They are read from the device when the
        sequence is first used: detect_by_patches launches the next batch before it reads
        this one, so that the device runs it while the host reads, maps and loads."""
        from mmdet.structures import DetDataSample
        inputs, samples = [], []
        for pixels in patches:
            height, width = pixels.shape[:2]
            inputs.append(channels_first(pixels, pinned=self.device.type == 'cuda'))
            samples.append(DetDataSample(metainfo=dict(
                img_shape=(height, width), ori_shape=(height, width), scale_factor=(1.0, 1.0))))
        with keep_padding(), autocast(enabled=self.amp):
            outputs = self.model.test_step(dict(inputs=inputs, data_samples=samples))
        return _ReadLater(PendingOutputs(outputs))


def channels_first(pixels: np.ndarray, pinned: bool) -> torch.Tensor:
    """(H, W, C) pixels as a (C, H, W) tensor of their own, in pinned memory when `pinned`: a
    copy from pageable memory to the GPU waits for the work queued before it, so the next
    batch's copy would wait for this batch's forward instead of overlapping it."""
    pixels = torch.from_numpy(pixels).permute(2, 0, 1)
    return torch.empty(pixels.shape, dtype=pixels.dtype, pin_memory=pinned).copy_(pixels)


def _as_detections(outputs) -> List[Detections]:
    found = []
    for output in outputs:
        pred = output.pred_instances
        boxes = getattr(pred.bboxes, 'tensor', pred.bboxes)
        found.append(Detections(boxes.detach().float().cpu().numpy().reshape(-1, 5),
                                pred.scores.detach().float().cpu().numpy(),
                                pred.labels.detach().cpu().numpy().astype(np.int64)))
    return found


class _ReadLater(SequenceABC):
    """A batch's detections, read (PendingOutputs.read) when first used."""

    def __init__(self, pending: PendingOutputs):
        self._pending, self._found = pending, None

    def _detections(self) -> List[Detections]:
        if self._found is None:
            self._found, self._pending = self._pending.read(_as_detections), None
        return self._found

    def __len__(self) -> int:
        return len(self._detections())

    def __getitem__(self, index):
        return self._detections()[index]


def _build_model(config, checkpoint: Optional[str], device: torch.device, cfg_options: Optional[dict]):
    """(model in eval mode on `device`, classes, palette); checkpoint and classes checked."""
    from mmengine.config import Config
    if isinstance(config, str):
        if not osp.isfile(config):
            raise ValueError(f'config file {config!r} does not exist')
        config = Config.fromfile(config)
    import redet_plugin.mm  # noqa: F401  (a config without custom_imports still finds our types)
    model = _init_detector_without_weights(config.copy(), cfg_options)
    classes, palette = _config_classes(model.cfg)
    if checkpoint is not None:
        loaded = load_checked_checkpoint(model, checkpoint)
        check_model_classes(model, classes, loaded, checkpoint, owner='the config')
    elif classes is not None:
        check_model_classes(model, classes, owner='the config')
    if classes is None:
        raise CheckpointMismatchError('the config names no classes (test_dataloader.dataset.metainfo.classes)')
    model.dataset_meta = dict(classes=classes, palette=palette)
    return model.to(device).eval(), tuple(classes), palette


def _init_detector_without_weights(cfg, cfg_options: Optional[dict]):
    """mmdet's init_detector (cfg_options, default scope, build, eval), on the CPU and without a
    checkpoint: its load is lenient (it loads what fits and warns about the rest) and reads
    without weights_only, so the checkpoint is read and checked by load_checked_checkpoint, on
    the CPU like init_detector's. The classes and palette come from the config (set after):
    the palette given here keeps init_detector from building the test data set for its own,
    and its note that without a checkpoint it takes COCO's classes is left out."""
    from mmdet.apis import init_detector
    with warnings.catch_warnings(record=True) as caught:  # (also undoes its simplefilter('once'))
        model = init_detector(cfg, None, palette='random', device='cpu', cfg_options=cfg_options)
    for warning in caught:
        if 'checkpoint is None' not in str(warning.message):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def _config_classes(cfg) -> Tuple[Optional[Tuple[str, ...]], Optional[list]]:
    """The classes (and palette) of the config's test, else val, else train data set."""
    from mmdet.registry import DATASETS
    for key in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        dataset = (cfg.get(key) or {}).get('dataset')
        while dataset is not None and 'dataset' in dataset and 'metainfo' not in dataset:
            dataset = dataset['dataset']  # wrappers (RepeatDataset, ...)
        if not dataset:
            continue
        metainfo = dict(dataset.get('metainfo') or {})
        dataset_type = dataset.get('type')
        defaults = {}
        if isinstance(dataset_type, str) and DATASETS.get(dataset_type) is not None:
            defaults = getattr(DATASETS.get(dataset_type), 'METAINFO', {}) or {}
        elif isinstance(dataset_type, type):
            defaults = getattr(dataset_type, 'METAINFO', {}) or {}
        classes = metainfo.get('classes', defaults.get('classes'))
        if classes is not None:
            palette = metainfo.get('palette', defaults.get('palette') if 'classes' not in metainfo else None)
            return tuple(classes), list(palette) if palette is not None else None
    return None, None
