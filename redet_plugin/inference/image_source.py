"""Images for inference, read by regions and given to the model as 3-channel 8-bit BGR.

Uncompressed TIFF, BMP and PPM/PGM files are memory-mapped: a region read touches only its own
rows, so an image of any size costs no memory of its own. An 8-bit PNG (gray, RGB, RGBA, not
interlaced, no transparency chunk) is decoded band by band in the background (png_bands.py): a
region can be read as soon as its rows are decoded, so the patches at the top run while the rest
of the file is decoded.
Other formats (JPEG, compressed TIFF, other PNGs) cannot be read by regions with OpenCV or Pillow;
they are decoded once, whole, in their own pixel type, and each region is converted when it is read.

Conversion to what the detector was trained on (3-channel 8-bit BGR, as OpenCV reads a colour image):
- grayscale (one channel, or gray + alpha): the gray value in all three channels;
- 4 channels: the alpha channel is dropped;
- 16-bit: stretched linearly so that the image's brightest pixel becomes 255
  (value * 255 / peak, rounded, peak = the whole image's maximum, so every patch is scaled alike);
  an image using the full 16-bit range is thus divided by 257.
"""
import os.path as osp
from typing import Optional, Tuple, Union

import cv2
import numpy as np

from .png_bands import PngDecodeError, open_png_bands

# Pillow's raw modes that map onto a plain array: numpy dtype, channels, channel order
_RAW_MODES = {'L': ('u1', 1, 'bgr'), 'RGB': ('u1', 3, 'rgb'), 'BGR': ('u1', 3, 'bgr'),
              'RGBA': ('u1', 4, 'rgb'), 'RGBX': ('u1', 4, 'rgb'), 'I;16': ('<u2', 1, 'bgr'),
              'I;16B': ('>u2', 1, 'bgr'), 'I;16N': ('=u2', 1, 'bgr')}
_PEAK_ROWS = 256  # rows per step when the peak of a memory-mapped 16-bit image is searched


class ImageReadError(ValueError):
    """An image is missing or cannot be used; the message is one line naming the file."""


class ImageSource:
    """One image, read by regions (`read`) as uint8 (h, w, 3) BGR; see the module docstring.

    Args:
        image: a path, or an array (H, W) or (H, W, C) in OpenCV's BGR(A) order, uint8 or uint16.
        name: the name used in messages and output files (default: the file's stem, or 'image').
    Attributes: height, width, name, memory_mapped (True when the file is memory-mapped).
    """

    def __init__(self, image: Union[str, np.ndarray], name: Optional[str] = None) -> None:
        self.memory_mapped = False
        if isinstance(image, np.ndarray):
            self.name = name or 'image'
            pixels, order = image, 'bgr'
        else:
            path = str(image)
            self.name = name or osp.splitext(osp.basename(path))[0]
            pixels, order = _open(path)
            base = getattr(pixels, 'base', None)
            self.memory_mapped = isinstance(base, np.memmap) or isinstance(pixels, np.memmap)
        label = f'image {self.name!r}' if isinstance(image, np.ndarray) else f'image {str(image)!r}'
        if pixels.ndim == 3 and pixels.shape[2] == 1:
            pixels = pixels[:, :, 0]
        if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (2, 3, 4)):
            raise ImageReadError(f'{label}: expected (H, W) or (H, W, 1-4 channels) pixels, got shape '
                                 f'{tuple(pixels.shape)}')
        if pixels.dtype.kind != 'u' or pixels.dtype.itemsize not in (1, 2):
            raise ImageReadError(f'{label}: pixel type {pixels.dtype} is not supported (8- or 16-bit images)')
        if pixels.shape[0] == 0 or pixels.shape[1] == 0:
            raise ImageReadError(f'{label}: the image is empty ({pixels.shape[1]} x {pixels.shape[0]} pixels)')
        self._pixels, self._rgb = pixels, order == 'rgb'
        self.height, self.width = int(pixels.shape[0]), int(pixels.shape[1])
        self._peak = _peak(pixels) if pixels.dtype.itemsize == 2 else None

    @property
    def shape(self) -> Tuple[int, int]:
        return self.height, self.width

    def read(self, top: int, left: int, height: int, width: int) -> np.ndarray:
        """Pixels [top, top + height) x [left, left + width), clipped to the image, as uint8 BGR."""
        rows, cols = slice(max(top, 0), max(top + height, 0)), slice(max(left, 0), max(left + width, 0))
        try:
            region = self._pixels[rows, cols]
        except PngDecodeError as error:  # a fault found past the rows read so far
            raise ImageReadError(str(error)) from None
        return to_bgr8(region, self._peak, self._rgb)


def to_bgr8(region: np.ndarray, peak: Optional[int] = None, rgb: bool = False) -> np.ndarray:
    """A region of raw pixels as contiguous uint8 (h, w, 3) BGR (module docstring's rules)."""
    if region.ndim == 3 and region.shape[2] in (2, 4):  # gray + alpha, BGRA: alpha dropped
        region = region[:, :, :1] if region.shape[2] == 2 else region[:, :, :3]
    if region.dtype.itemsize == 2:
        scale = 255.0 / max(int(peak or 0), 1)
        region = np.rint(region.astype(np.float32) * scale).astype(np.uint8)
    if region.ndim == 2 or region.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(region.reshape(region.shape[:2] + (1,)), 3, axis=2))
    return np.ascontiguousarray(region[:, :, ::-1] if rgb else region)


def _peak(pixels: np.ndarray) -> int:
    """The largest value of a 16-bit image, a band of rows at a time (a memory-mapped file is
    streamed, not loaded)."""
    return max(int(pixels[top:top + _PEAK_ROWS].max()) for top in range(0, pixels.shape[0], _PEAK_ROWS))


def _open(path: str) -> Tuple[np.ndarray, str]:
    """(pixels, channel order): memory-mapped where the file allows it, else decoded whole."""
    if not osp.exists(path):
        raise ImageReadError(f'image {path!r} does not exist')
    if not osp.isfile(path):
        raise ImageReadError(f'image {path!r} is not a file')
    mapped = _memory_map(path)
    if mapped is not None:
        return mapped
    try:
        bands = open_png_bands(path)
    except PngDecodeError as error:
        raise ImageReadError(str(error)) from None
    if bands is not None:
        return bands, 'bgr'
    pixels = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if pixels is None:
        raise ImageReadError(f'image {path!r} cannot be read (not an image, or a format OpenCV does not read)')
    return pixels, 'bgr'


def _memory_map(path: str) -> Optional[Tuple[np.ndarray, str]]:
    """The pixels of an uncompressed file as a read-only memory map, from the layout Pillow
    reports (one or more 'raw' blocks of whole rows, one after the other); None otherwise."""
    from PIL import Image
    try:
        with Image.open(path) as image:
            width, height = image.size
            tiles = sorted(image.tile, key=lambda t: t[1][1])
    except Exception:  # not an image Pillow knows: OpenCV may still read it
        return None
    if not tiles or any(t[0] != 'raw' for t in tiles):
        return None
    args = [t[3] if isinstance(t[3], tuple) else (t[3], 0, 1) for t in tiles]
    rawmode, stride, orientation = (tuple(args[0]) + (0, 1))[:3]
    if rawmode not in _RAW_MODES or any(tuple(a)[:1] != (rawmode,) for a in args):
        return None
    dtype, channels, order = _RAW_MODES[rawmode]
    row_bytes = width * channels * np.dtype(dtype).itemsize
    stride = stride or row_bytes
    first = tiles[0][2]
    for (_, (x0, y0, x1, y1), offset, _), a in zip(tiles, args):
        a = (tuple(a) + (0, 1))[:3]
        if (x0, x1) != (0, width) or offset != first + y0 * stride or (a[1] or row_bytes) != stride \
                or a[2] != orientation:
            return None
    if tiles[0][1][1] != 0 or tiles[-1][1][3] != height or stride < row_bytes or orientation not in (1, -1):
        return None
    if osp.getsize(path) < first + stride * height:  # a truncated file
        return None
    rows = np.memmap(path, dtype=np.uint8, mode='r', offset=first, shape=(height, stride))
    pixels = rows[:, :row_bytes].view(np.dtype(dtype)).reshape(height, width, channels)
    if orientation == -1:  # rows stored bottom-up (BMP)
        pixels = pixels[::-1]
    return pixels, order
