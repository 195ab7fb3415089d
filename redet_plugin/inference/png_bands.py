"""A PNG file decoded band by band in the background, its rows readable as soon as they are decoded.

OpenCV and Pillow decode a PNG whole before any pixel can be read: for a huge image the GPU waits
for the whole decode (about 0.6 s for a 5120 x 5120 file) before its first patch. A PNG's pixels
are one zlib stream of filtered rows, so here one thread inflates the stream and another
undoes the row filters band by band with libpng (OpenCV's imdecode of the band, written as a PNG
of its own whose first row is the band's previous row, decoded: the filters of a band's first row
refer to it); the inflate of one band and the unfiltering of the one before run at once, both
outside the GIL, and the patches at the top of the image run while the rest is decoded.

Only the PNGs whose pixels libpng hands over as they are stored stream: 8-bit, not interlaced,
gray, RGB or RGBA, without a transparency chunk (the common case of aerial images); `open_png_bands`
returns None for the others, which are decoded whole. The pixels are those of
cv2.imread(path, cv2.IMREAD_UNCHANGED): gray (H, W), BGR or BGRA (H, W, C).
"""
import atexit
import os
import queue
import struct
import threading
import weakref
import zlib
from typing import Iterator, NamedTuple, Optional

import cv2
import numpy as np

try:  # ISA-L's inflate (python-isal, a requirement of the mm layer): about twice zlib's speed
    from isal.isal_zlib import decompressobj as _decompressobj, error as _isal_error
    _INFLATE_ERRORS = (zlib.error, _isal_error)
except ImportError:
    from zlib import decompressobj as _decompressobj
    _INFLATE_ERRORS = (zlib.error,)

_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_CHANNELS = {0: 1, 2: 3, 6: 4}  # PNG colour type -> channels (gray, RGB, RGBA)
# Each step hands the GIL back a few times, and while the main thread runs Python a thread waits
# up to the switch interval (5 ms) to get it back: steps of megabytes, not of chunks (OpenCV
# writes 8 KB ones). Smaller bands overlap the two threads better.
_BAND_BYTES = 1 << 21  # filtered bytes per band: 2 MB, 136 rows of a 5120-wide RGB image
_READ_BYTES = 1 << 20  # compressed bytes per inflate call


class PngDecodeError(ValueError):
    """The file is not a whole, valid PNG; the message names it."""


class PngLayout(NamedTuple):
    width: int
    height: int
    colour: int  # PNG colour type: 0 gray, 2 RGB, 6 RGBA
    first_chunk: int  # file offset of the first IDAT chunk

    @property
    def channels(self) -> int:
        return _CHANNELS[self.colour]


def png_layout(path: str) -> Optional[PngLayout]:
    """The layout of a PNG that streams (module docstring); None for any other file."""
    with open(path, 'rb') as f:
        if f.read(8) != _SIGNATURE:
            return None
        header = f.read(8 + 13)
        if len(header) < 21 or header[4:8] != b'IHDR':
            return None
        width, height, depth, colour, _, _, interlace = struct.unpack('>IIBBBBB', header[8:21])
        if depth != 8 or interlace != 0 or colour not in _CHANNELS or not width or not height:
            return None
        offset = 8 + 8 + 13 + 4
        while True:
            f.seek(offset)
            head = f.read(8)
            if len(head) < 8:
                return None
            length, kind = struct.unpack('>I', head[:4])[0], head[4:]
            if kind == b'IDAT':
                return PngLayout(width, height, colour, offset)
            if kind in (b'tRNS', b'IEND'):
                return None
            offset += 12 + length


class PngBands:
    """The pixels of a PNG with `png_layout`, decoded in the background (module docstring).

    `shape`, `ndim`, `dtype` as the decoded array's; `pixels[rows, cols]` (two slices) waits
    until those rows are decoded. The first band is decoded before the constructor returns, so a
    file that is not a PNG at all fails there; a fault further on (corrupt or missing data)
    raises PngDecodeError from the first read of the rows it leaves undecoded. Dropping the
    object, or the interpreter's exit, stops the decoding at its next band.
    """

    def __init__(self, path: str, layout: PngLayout, band_bytes: int = _BAND_BYTES) -> None:
        self._decoder = _BandDecoder(path, layout, band_bytes)
        self.shape, self.ndim, self.dtype = self._decoder.shape, len(self._decoder.shape), np.dtype(np.uint8)
        weakref.finalize(self, self._decoder.stop)

    def __getitem__(self, key) -> np.ndarray:
        rows, cols = key
        return self._decoder.pixels_when_decoded(rows, cols)

    def wait(self) -> None:
        """Until every row is decoded (raises the decoder's error)."""
        self[self.shape[0]:, :]


class _BandDecoder:
    """Decodes the first band, then the rest in two threads: one inflates, one unfilters."""

    def __init__(self, path: str, layout: PngLayout, band_bytes: int) -> None:
        self.path, self._layout = path, layout
        channels = layout.channels
        self.shape = (layout.height, layout.width) + ((channels,) if channels > 1 else ())
        self._pixels = np.empty(self.shape, np.uint8)
        self._row_bytes = 1 + layout.width * channels  # the filter byte, then the samples
        self._band_rows = max(1, band_bytes // self._row_bytes)
        self._done, self._error, self._forked = 0, None, False
        self._changed, self._stopped = threading.Condition(), threading.Event()
        bands = self._filtered_bands()
        try:
            self._unfilter(next(bands), 0)
        except StopIteration:
            self._fail('its image data ends before its first rows')
        except _INFLATE_ERRORS as error:
            self._fail(f'its image data is corrupt ({error})')
        todo = queue.Queue()
        self._threads = [threading.Thread(target=self._inflate, args=(bands, todo), daemon=True,
                                          name='png-inflate'),
                         threading.Thread(target=self._unfilter_all, args=(todo,), daemon=True,
                                          name='png-unfilter')]
        _RUNNING.add(self)
        for thread in self._threads:
            thread.start()

    def pixels_when_decoded(self, rows: slice, cols: slice) -> np.ndarray:
        needed = min(max(rows.stop if rows.stop is not None else self.shape[0], 0), self.shape[0])
        if self._forked and self._done < needed and self._error is None:
            self._decode_the_rest_whole()
        with self._changed:
            self._changed.wait_for(lambda: self._done >= needed or self._error is not None)
            if self._done < needed:
                raise self._error
        return self._pixels[rows, cols]

    def stop(self) -> None:
        self._stopped.set()

    def after_fork(self) -> None:
        """In a child process the threads are gone (and their lock may have been held): the
        rows not yet decoded are decoded whole, by the first read that needs them."""
        self._changed, self._forked = threading.Condition(), True

    def _decode_the_rest_whole(self) -> None:
        pixels = cv2.imread(self.path, cv2.IMREAD_UNCHANGED)
        if pixels is None or pixels.shape != self.shape:
            self._error = self._decode_error('OpenCV cannot decode it')
            return
        self._pixels[self._done:] = pixels[self._done:]
        self._done = self.shape[0]

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    # --- the two threads ---

    def _inflate(self, bands: Iterator[bytes], todo: queue.Queue) -> None:
        top = self._band_rows
        try:
            for band in bands:
                if self._stopped.is_set():
                    break
                todo.put((band, top))
                top += len(band) // self._row_bytes
        except BaseException as error:  # noqa: B902 (ends the pipeline; handed to the reader)
            todo.put(error)
        todo.put(None)

    def _unfilter_all(self, todo: queue.Queue) -> None:
        try:
            while True:
                item = todo.get()
                if self._stopped.is_set():
                    self._fail('decoding was stopped')
                if item is None:
                    if self._done < self.shape[0]:
                        self._fail(f'its image data ends after {self._done} of {self.shape[0]} rows')
                    return
                if isinstance(item, BaseException):
                    raise item
                self._unfilter(*item)
        except PngDecodeError as error:
            self._set_error(error)
        except Exception as error:  # noqa: B902 (anything else is a fault of the file too)
            self._set_error(self._decode_error(str(error)))
        finally:  # (the inflate thread ends at its next band)
            if self._done < self.shape[0] and self._error is None:  # no reader may wait forever
                self._set_error(self._decode_error('decoding ended early'))
            self._stopped.set()
            self._threads[0].join()
            _RUNNING.discard(self)

    def _set_error(self, error: BaseException) -> None:
        with self._changed:
            self._error = error
            self._changed.notify_all()

    def _decode_error(self, why: str) -> PngDecodeError:
        return PngDecodeError(f'PNG {self.path!r} cannot be decoded: {why}')

    def _fail(self, why: str):
        raise self._decode_error(why)

    def _filtered_bands(self) -> Iterator[bytes]:
        """The inflated image data, `_band_rows` filtered rows at a time. The last band comes
        after the end of the stream and its checksum (of all the inflated data), so a
        corruption that inflates fails at the latest the read of the last rows."""
        band_bytes = self._band_rows * self._row_bytes
        total = self.shape[0] * self._row_bytes
        inflater, pending, given = _decompressobj(), bytearray(), 0
        for data in self._image_data():
            pending += inflater.decompress(data)
            while len(pending) >= band_bytes and given + band_bytes < total:
                yield bytes(pending[:band_bytes])
                del pending[:band_bytes]
                given += band_bytes
            if inflater.eof:
                break
        if not inflater.eof or given + len(pending) < total:
            return  # the reader names what is missing
        if given + len(pending) > total:
            self._fail('its image data is longer than its rows')
        yield bytes(pending)

    def _image_data(self) -> Iterator[bytes]:
        """The IDAT chunks' data, about _READ_BYTES at a time. Their CRCs are not checked: the
        inflated data's checksum covers them (a check per chunk of 8 KB, OpenCV's size, would
        hand the GIL back and forth thousands of times)."""
        with open(self.path, 'rb', buffering=_READ_BYTES) as f:
            f.seek(self._layout.first_chunk)
            block, size = [], 0
            while True:
                head = f.read(8)
                if len(head) < 8 or head[4:] != b'IDAT':
                    break
                length = struct.unpack('>I', head[:4])[0]
                data = f.read(length)
                f.read(4)  # the CRC
                if len(data) < length:
                    break
                block.append(data)
                size += length
                if size >= _READ_BYTES:
                    yield b''.join(block)
                    block, size = [], 0
            if block:
                yield b''.join(block)

    def _unfilter(self, band: bytes, top: int) -> None:
        """Rows [top, top + len(band) rows) from their filtered bytes, through libpng."""
        rows = len(band) // self._row_bytes
        if rows * self._row_bytes != len(band):
            self._fail('its image data does not end on a row')
        previous = b''
        if top:  # the row the band's filters refer to, stored unfiltered (filter byte 0)
            stored = self._pixels[top - 1]
            if stored.ndim == 2:  # BGR(A) -> the file's RGB(A)
                stored = stored[:, [2, 1, 0, 3][:stored.shape[1]]]
            previous = b'\x00' + np.ascontiguousarray(stored).tobytes()
        decoded = cv2.imdecode(np.frombuffer(self._band_png(previous + band, rows + bool(top)), np.uint8),
                               cv2.IMREAD_UNCHANGED)
        if decoded is None or decoded.shape[:2] != (rows + bool(top), self.shape[1]):
            self._fail(f'rows {top} to {top + rows} do not decode')
        self._pixels[top:top + rows] = decoded[bool(top):]
        with self._changed:
            self._done = top + rows
            self._changed.notify_all()

    def _band_png(self, filtered: bytes, rows: int) -> bytes:
        """A PNG of `rows` rows of this image's width and format, its data stored uncompressed."""
        header = struct.pack('>IIBBBBB', self.shape[1], rows, 8, self._layout.colour, 0, 0, 0)
        return _SIGNATURE + _chunk(b'IHDR', header) + _chunk(b'IDAT', zlib.compress(filtered, 0)) + \
            _chunk(b'IEND', b'')


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(data, zlib.crc32(kind)))


def open_png_bands(path: str) -> Optional[PngBands]:
    """PngBands of the file when it is a PNG that streams, else None (decode it whole)."""
    layout = png_layout(path)
    return PngBands(path, layout) if layout is not None else None


# Decoders still running: stopped and joined at exit, before the interpreter ends their threads
# (a daemon thread ended inside OpenCV's C++ aborts the process); in a forked child (a data
# loader's worker), finished there without threads.
_RUNNING = set()


def _continue_in_a_child_process() -> None:
    for decoder in _RUNNING:
        decoder.after_fork()
    _RUNNING.clear()


if hasattr(os, 'register_at_fork'):  # (POSIX)
    os.register_at_fork(after_in_child=_continue_in_a_child_process)


@atexit.register
def _stop_running_decoders() -> None:
    running = list(_RUNNING)
    for decoder in running:
        decoder.stop()
    for decoder in running:
        decoder.join(timeout=10)
