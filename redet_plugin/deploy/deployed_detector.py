"""DeployedDetector: an exported ReDet package run on images, with torch and redet_plugin.ops.

The package's forward takes one (H, W, 3) uint8 BGR image of its input size and returns
max_detections fixed-size rows (valid ones first) and their count; this class pads smaller
images, refuses larger ones, and cuts the rows to the count.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

import redet_plugin.ops  # noqa: F401  (registers the custom ops the package calls, before loading)
from redet_plugin.utils.precision import tf32_matmuls

from .compatibility import check_versions, run_device
from .graphed_forward import GraphedForward
from .package_format import read_metadata
from .polygons import rbox_corners


@dataclass
class DeployedDetections:
    """The detections of one image, in its pixels, highest score first (CPU tensors).

    boxes (K, 5) float32 (cx, cy, w, h, theta radians, le90); scores (K,) float32; labels (K,)
    int64 indices into `classes`.
    """
    boxes: Tensor
    scores: Tensor
    labels: Tensor
    classes: Tuple[str, ...]

    def __len__(self) -> int:
        return int(self.scores.numel())

    @property
    def class_names(self) -> List[str]:
        return [self.classes[int(label)] for label in self.labels]

    @property
    def polygons(self) -> Tensor:
        """(K, 8) corners x1 y1 ... x4 y4 (DOTA's order)."""
        return rbox_corners(self.boxes)


class DeployedDetector:
    """A loaded package (use `load`). Call it with an (H, W, 3) uint8 BGR image (numpy array, as
    cv2.imread gives, or tensor) no larger than `input_size`. A compiled package on a GPU runs
    as one CUDA graph with buffers of its own: one call at a time."""

    def __init__(self, forward, meta: dict, device: torch.device, path: str, tf32: bool = False):
        self._forward = forward
        self.tf32 = tf32  # the forward's matrix products in TF32 (see load)
        self.meta = meta
        self.device = device
        self.path = path
        self.classes = tuple(meta['classes'])
        self.input_size = (int(meta['input_size'][0]), int(meta['input_size'][1]))
        self.kind = meta['kind']
        self.max_detections = int(meta['max_detections'])
        self.dtype = meta['dtype']  # what the forward computes in ('float16': fp16 autocast)
        self._staging = self._staging_free = None

    def __repr__(self) -> str:
        return (f'DeployedDetector({self.path!r}, kind={self.kind}, device={self.device}, '
                f'dtype={self.dtype}, input_size={self.input_size}, classes={len(self.classes)})')

    @property
    def cuda_graph(self) -> bool:
        """Whether the forward runs as a captured CUDA graph (known after the first image)."""
        return isinstance(self._forward, GraphedForward) and self._forward.captured

    @torch.inference_mode()
    def __call__(self, image) -> DeployedDetections:
        pixels = self._padded(_as_image_tensor(image))
        if self.device.type == 'cuda':
            pixels = self._uploaded(pixels)
        with tf32_matmuls(self.tf32):
            outputs = self._forward(pixels)
        boxes, scores, labels, count = self._to_host(outputs)
        count = int(count)
        return DeployedDetections(boxes[:count].float(), scores[:count].float(),
                                  labels[:count].long(), self.classes)

    def _uploaded(self, pixels: Tensor) -> Tensor:
        """pixels on the GPU through a pinned buffer of this detector's (a copy from pageable
        memory is slower and blocks the host)."""
        if self._staging is None or self._staging.shape != pixels.shape:
            self._staging = torch.empty(pixels.shape, dtype=pixels.dtype, pin_memory=True)
            self._staging_free = torch.cuda.Event()
        else:  # (an earlier call that raised may have left its upload running)
            self._staging_free.synchronize()
        self._staging.copy_(pixels)
        on_device = self._staging.to(self.device, non_blocking=True)
        self._staging_free.record(torch.cuda.current_stream(self.device))
        return on_device

    def _to_host(self, outputs):
        """The fixed-size outputs on the host, copied together and waited for once (not one
        read-back a tensor)."""
        if self.device.type != 'cuda':
            return outputs
        on_host = [output.to('cpu', non_blocking=True) for output in outputs]
        torch.cuda.current_stream(self.device).synchronize()
        return on_host

    def _padded(self, pixels: Tensor) -> Tensor:
        height, width = pixels.shape[:2]
        size_h, size_w = self.input_size
        if height > size_h or width > size_w:
            raise ValueError(f'image: {height}x{width} (HxW) is larger than the package\'s input '
                             f'size {size_h}x{size_w}; cut it into patches or export the model '
                             f'with --image-size {height} {width}')
        if (height, width) != (size_h, size_w):  # bottom and right: boxes keep their pixels
            pixels = F.pad(pixels.permute(2, 0, 1), (0, size_w - width, 0, size_h - height))
            pixels = pixels.permute(1, 2, 0)
        return pixels.contiguous()


def load(path: str, device: Optional[str] = None, cuda_graph: bool = True,
         tf32: bool = True) -> DeployedDetector:
    """The package at `path` (tools/export.py), ready to run on `device` (default: the one it
    was exported for). A file that is no package, or one made by another torch or redet_plugin
    version or for another kind of device, raises an error of one line naming both.

    cuda_graph: a compiled package on a GPU captures its forward on the first image and replays
    it after (the kernels launched at once instead of one by one by AOTInductor's runtime). The
    exported program (the package without --compile) runs eagerly: its traced graph copies a
    constant from the host, which a capture cannot hold.
    tf32: on a GPU, the forward's float32 matrix products (the R-CNN heads' linear layers) run
    in TF32, as cuDNN runs float32 convolutions by default, whatever torch's matmul setting
    (which is left as it was). False: torch's settings decide (full float32 by default).
    """
    for name, value in (('cuda_graph', cuda_graph), ('tf32', tf32)):
        if not isinstance(value, bool):
            raise TypeError(f'{name}: expected True or False, got {value!r}')
    path = str(path)
    meta = read_metadata(path)
    check_versions(meta, path)
    chosen = run_device(meta, device, path)
    if meta['kind'] == 'compiled':
        from torch import _inductor  # (loaded on first use: a program package does not need it)
        graphed = cuda_graph and chosen.type == 'cuda'
        # single-threaded: the runtime's completion event conflicts with a capture (torch's advice)
        forward = _inductor.aoti_load_package(
            path, run_single_threaded=graphed,
            device_index=chosen.index if chosen.type == 'cuda' else -1)
        if graphed:
            forward = GraphedForward(forward, chosen)
    elif meta['kind'] == 'program':
        forward = torch.export.load(path).module()
    else:
        raise ValueError(f'package {path!r}: unknown kind {meta["kind"]!r} (expected program '
                         f'or compiled)')
    return DeployedDetector(forward, meta, chosen, path, tf32=tf32 and chosen.type == 'cuda')


def _as_image_tensor(image) -> Tensor:
    """An (H, W, 3) uint8 tensor from a numpy array or a tensor."""
    if type(image).__module__ == 'numpy':
        image = torch.from_numpy(image)
    if not isinstance(image, Tensor):
        raise TypeError(f'image: expected an (H, W, 3) uint8 numpy array or tensor, got '
                        f'{type(image).__name__}')
    if image.dim() != 3 or image.shape[2] != 3 or image.dtype != torch.uint8:
        raise ValueError(f'image: expected (H, W, 3) uint8 BGR pixels, got shape '
                         f'{tuple(image.shape)} and dtype {image.dtype}')
    return image
