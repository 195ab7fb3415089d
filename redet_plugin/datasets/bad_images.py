"""Images that cannot be read: one line naming the file, or (on_bad_image='skip') left out and
listed at the end of the run.

An image is bad when it is missing, empty, not an image, cut short (a PNG without its IEND chunk,
a JPEG without its end marker after the scan: libjpeg only warns about such a JPEG, and some
OpenCV builds return it half grey), or when the pipeline's image loading fails on it. The data sets of this
package (RedetDOTADataset and its versions, RedetHRSCDataset, RedetDIORDataset) take
`on_bad_image`:
- 'error' (default): BadImageError, whose message names the file and the reason. Raised in a
  loader worker, it reaches the main process inside torch's "Caught ... in DataLoader worker"
  text; the tools print its last line (redet_plugin/engine/cli.py, data_error_message).
- 'skip': an image found bad while the data set is listed is left out; in training, one found
  bad when loaded is replaced by another image (mmengine's refetch), and the skip is carried to
  the main process in the batch (metainfo 'skipped_images' of the replacement's data sample) for
  RedetBadImagesHook to list at the end of the run. A test set cannot leave out an image once
  the test has begun: there the error stands.
"""
import os
import os.path as osp
import warnings
from typing import List, Optional, Tuple

from .draws import seeded_draws
from .errors import BadImageError, DOTAAnnotationWarning

ON_BAD_IMAGE = ('error', 'skip')
SKIPPED_KEY = 'skipped_images'  # the metainfo key of a data sample that replaced bad images
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_PNG_END = b'IEND\xaeB`\x82'  # the IEND chunk's type and CRC
_TAIL = 1 << 16


def bad_image_message(path: str, reason: str) -> str:
    return f'image {path!r} cannot be read: {reason}'


def _jpeg_cut_short(f, size: int) -> bool:
    """True when the JPEG has no end-of-image marker after its first scan. (Entropy-coded data
    never holds FF D9, and a thumbnail's end marker lies inside the APP1 segment skipped here.)"""
    pos = 2
    while True:  # the segments before the first scan (SOS)
        f.seek(pos)
        head = f.read(4)
        if len(head) < 2 or head[0] != 0xFF:
            return True
        marker = head[1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker == 0xDA:
            break
        elif marker == 0xD9:
            return True
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
        elif len(head) < 4:
            return True
        else:
            pos += 2 + int.from_bytes(head[2:4], 'big')
        if pos >= size:
            return True
    f.seek(max(pos, size - _TAIL))
    if b'\xff\xd9' in f.read():
        return False
    f.seek(pos)  # bytes after the end marker? (rare): read the scans
    return b'\xff\xd9' not in f.read()


def image_file_problem(path: str) -> Optional[str]:
    """Why the file at `path` cannot be an image (missing, empty, a PNG or JPEG cut short), or
    None. Reads the file's first and last bytes, not its pixels."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            return 'the file is empty (0 bytes)'
        with open(path, 'rb') as f:
            head = f.read(8)
            if head.startswith(_PNG_SIGNATURE):
                f.seek(max(0, size - _TAIL))
                if _PNG_END not in f.read():
                    return 'the PNG is cut short (no IEND chunk at its end)'
            elif head.startswith(b'\xff\xd8'):
                if _jpeg_cut_short(f, size):
                    return 'the JPEG is cut short (no end marker after its image data)'
    except FileNotFoundError:
        return 'the file does not exist'
    except OSError as error:
        return f'{type(error).__name__}: {error.strerror or error}'
    return None


def read_image_size(path: str) -> Tuple[Optional[Tuple[int, int]], Optional[str]]:
    """((width, height), None) from a sound image file's header, or (None, why it is bad)."""
    from PIL import Image
    problem = image_file_problem(path)
    if problem is not None:
        return None, problem
    try:
        with Image.open(path) as image:  # reads the header only
            return image.size, None
    except Exception as error:  # noqa: BLE001 (PIL raises many kinds)
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        return None, f'not an image PIL can identify ({message})'


def _is_image_loading(transform) -> bool:
    """mmcv's LoadImageFromFile and its subclasses (mmdet's), or another loader of that name."""
    from mmcv.transforms import LoadImageFromFile
    return isinstance(transform, LoadImageFromFile) or 'LoadImage' in type(transform).__name__


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f'{type(error).__name__}: {text.splitlines()[0]}' if text else type(error).__name__


def _load_error_reason(path: str, error: BaseException) -> str:
    """Why loading `path` failed: what is wrong with the file where that can be seen (missing,
    empty, cut short), else the loader's error in one line."""
    problem = image_file_problem(path) if isinstance(path, str) and osp.exists(path) else None
    if problem is None and isinstance(path, str) and not osp.exists(path):
        problem = 'the file does not exist'
    if problem is not None:
        return problem
    if isinstance(error, AssertionError) and 'failed to load image' in str(error):
        return 'its image data cannot be decoded (a damaged file, or a format OpenCV cannot read)'
    return _first_line(error)


class BadImagesMixin:
    """The on_bad_image policy of a BaseDetDataset (see the module's docstring), and the seeded
    pipeline draws of DrawIndex indices (redet_plugin/datasets/draws.py). Set `on_bad_image`
    before BaseDetDataset.__init__ (which lists the data)."""

    on_bad_image = 'error'

    def _set_on_bad_image(self, on_bad_image: str) -> None:
        if on_bad_image not in ON_BAD_IMAGE:
            raise ValueError(f'{type(self).__name__}: on_bad_image must be one of {list(ON_BAD_IMAGE)}, '
                             f'got {on_bad_image!r}')
        self.on_bad_image = on_bad_image
        self.skipped_images: List[str] = []  # 'path: reason', in the order found (this process)
        self._skipped_unreported: List[str] = []

    def _bad_image(self, path: str, reason: str) -> None:
        """An image found bad while listing: BadImageError, or left out with a warning."""
        message = bad_image_message(path, reason)
        if self.on_bad_image == 'error':
            raise BadImageError(f'{type(self).__name__}: {message} (on_bad_image=\'skip\' leaves '
                                f'such images out)')
        warnings.warn(f'{type(self).__name__}: skipped: {message}', DOTAAnnotationWarning)
        self.skipped_images.append(f'{path}: {reason}')

    def _skipped(self) -> List[str]:
        return getattr(self, 'skipped_images', [])

    def prepare_data(self, idx):
        """mmengine's prepare_data (the pipeline on the data info), with an image that cannot be
        loaded reported as BadImageError, or (training, on_bad_image='skip') as None: mmengine's
        __getitem__ then takes another image."""
        data = self.get_data_info(idx)
        transforms = getattr(self.pipeline, 'transforms', None)
        if transforms is None:  # (not mmengine's Compose: no step to tell the loading apart)
            return self.pipeline(data)
        for transform in transforms:
            loading = _is_image_loading(transform)
            try:
                data = transform(data)
            except Exception as error:  # noqa: BLE001
                if not loading:
                    raise
                path = data.get('img_path', '?')
                return self._load_failed(path, _load_error_reason(path, error))
            if data is None:
                return None
            if loading and str(data.get('img_path', '')).lower().endswith(('.jpg', '.jpeg')) \
                    and osp.isfile(data['img_path']):
                problem = image_file_problem(data['img_path'])
                if problem is not None:
                    return self._load_failed(data['img_path'], problem)
        return data

    def _load_failed(self, path: str, reason: str):
        if self.on_bad_image == 'skip' and not self.test_mode:
            warnings.warn(f'{type(self).__name__}: skipped: {bad_image_message(path, reason)}',
                          DOTAAnnotationWarning)
            self._skipped().append(f'{path}: {reason}')
            self._skipped_unreported.append(f'{path}: {reason}')
            return None
        hint = (" (on_bad_image='skip' leaves bad images out of training; a test cannot leave an "
                "image out once begun)" if self.test_mode else
                " (on_bad_image='skip' leaves such images out)")
        raise BadImageError(f'{type(self).__name__}: {bad_image_message(path, reason)}{hint}')

    def __getitem__(self, idx):
        seed = getattr(idx, 'seed', None)
        if seed is None:
            data = super().__getitem__(idx)
        else:
            with seeded_draws(seed):
                data = super().__getitem__(int(idx))
        unreported = getattr(self, '_skipped_unreported', None)
        if unreported:  # to the main process, with the image that replaced them
            sample = data.get('data_samples') if isinstance(data, dict) else None
            if sample is not None and hasattr(sample, 'set_metainfo'):
                sample.set_metainfo({SKIPPED_KEY: list(unreported)})
                unreported.clear()
        return data
