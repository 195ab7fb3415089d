"""PNG decoding by bands (inference/png_bands.py) against OpenCV's whole decode."""
import struct
import subprocess
import sys
import threading
import time
import zlib

import cv2
import numpy as np
import pytest

from redet_plugin.inference import ImageReadError, ImageSource
from redet_plugin.inference import png_bands
from redet_plugin.inference.png_bands import PngBands, PngDecodeError, open_png_bands, png_layout

COLOUR_TYPES = {1: 0, 3: 2, 4: 6}


def _filtered(rows: np.ndarray, filters, bpp: int) -> bytes:
    """PNG's five filters, row by row, from the raw bytes (H, row bytes) (the spec's formulas)."""
    out = []
    previous = np.zeros(rows.shape[1], np.int32)
    for row, kind in zip(rows.astype(np.int32), filters):
        left = np.concatenate([np.zeros(bpp, np.int32), row[:-bpp]])
        upper_left = np.concatenate([np.zeros(bpp, np.int32), previous[:-bpp]])
        if kind == 0:
            predicted = np.zeros_like(row)
        elif kind == 1:
            predicted = left
        elif kind == 2:
            predicted = previous
        elif kind == 3:
            predicted = (left + previous) // 2
        else:
            p = left + previous - upper_left
            pa, pb, pc = abs(p - left), abs(p - previous), abs(p - upper_left)
            predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, previous, upper_left))
        out.append(bytes([kind]) + ((row - predicted) % 256).astype(np.uint8).tobytes())
        previous = row
    return b''.join(out)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(data, zlib.crc32(kind)))


def write_png(path, pixels: np.ndarray, filters=None, idat_size: int = 997, interlace: int = 0,
              extra_chunks=(), compressed=None) -> str:
    """An 8-bit PNG of `pixels` ((H, W) gray, or (H, W, 3 | 4) in RGB(A) order) with the given
    filter per row (default: the five in turn), its data cut into IDAT chunks of idat_size."""
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    filters = filters if filters is not None else [row % 5 for row in range(height)]
    data = compressed if compressed is not None else zlib.compress(
        _filtered(pixels.reshape(height, -1), filters, channels), 6)
    header = struct.pack('>IIBBBBB', width, height, 8, COLOUR_TYPES[channels], 0, 0, interlace)
    idats = b''.join(_chunk(b'IDAT', data[i:i + idat_size])
                     for i in range(0, len(data), idat_size))
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', header) + b''.join(extra_chunks) + idats +
                _chunk(b'IEND', b''))
    return str(path)


def _pixels(height, width, channels, seed=0):
    rng = np.random.default_rng(seed)
    shape = (height, width) if channels == 1 else (height, width, channels)
    smooth = np.cumsum(rng.integers(-3, 4, shape), axis=1)  # so that every filter has work
    return ((smooth + rng.integers(0, 256, shape[:1] + (1,) * (len(shape) - 1))) % 256).astype(np.uint8)


def _small_bands(path, rows_per_band=3):
    layout = png_layout(path)
    return PngBands(path, layout, band_bytes=rows_per_band * (1 + layout.width * layout.channels))


@pytest.mark.parametrize('channels', [1, 3, 4])
@pytest.mark.parametrize('rows_per_band', [1, 3, 64])
def test_bands_equal_opencvs_whole_decode_for_every_filter(tmp_path, channels, rows_per_band):
    path = write_png(tmp_path / 'a.png', _pixels(37, 29, channels))
    expected = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    bands = _small_bands(path, rows_per_band)
    assert bands.shape == expected.shape and bands.dtype == expected.dtype
    assert np.array_equal(bands[0:37, 0:29], expected)


def test_zlibs_inflate_gives_the_same_pixels(tmp_path, monkeypatch):
    monkeypatch.setattr(png_bands, '_decompressobj', zlib.decompressobj)
    path = write_png(tmp_path / 'a.png', _pixels(40, 31, 3))
    assert np.array_equal(_small_bands(path, 2)[0:40, 0:31], cv2.imread(path, cv2.IMREAD_UNCHANGED))


@pytest.mark.parametrize('encoder', ['opencv', 'pillow'])
def test_files_of_other_encoders(tmp_path, encoder):
    from PIL import Image
    bgr = _pixels(300, 211, 3, seed=1)
    path = str(tmp_path / 'b.png')
    if encoder == 'opencv':
        cv2.imwrite(path, bgr)
    else:
        Image.fromarray(bgr[:, :, ::-1]).save(path)
    assert png_layout(path) is not None
    expected = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert np.array_equal(_small_bands(path, 7)[0:300, 0:211], expected)
    source = ImageSource(path)
    assert np.array_equal(source.read(10, 20, 250, 150), expected[10:260, 20:170])


def test_rows_read_before_the_rows_above_them_wait_for_them(tmp_path):
    path = write_png(tmp_path / 'a.png', _pixels(120, 50, 3))
    expected = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    bands = _small_bands(path, 1)
    assert np.array_equal(bands[110:200, 5:20], expected[110:, 5:20])
    assert np.array_equal(bands[0:10, 0:50], expected[:10])


def test_image_source_streams_a_png_and_reads_as_opencv_does(tmp_path):
    rgba = _pixels(64, 48, 4)
    path = write_png(tmp_path / 'a.png', rgba)
    source = ImageSource(path)
    assert isinstance(source._pixels, PngBands) and (source.height, source.width) == (64, 48)
    assert np.array_equal(source.read(-5, 3, 40, 100), cv2.imread(path)[:35, 3:])


@pytest.mark.parametrize('case', ['sixteen_bit', 'palette', 'interlaced', 'transparency'])
def test_other_pngs_are_decoded_whole(tmp_path, case):
    path = str(tmp_path / 'c.png')
    if case == 'sixteen_bit':
        cv2.imwrite(path, (_pixels(20, 30, 3).astype(np.uint16) * 257))
    elif case == 'palette':
        from PIL import Image
        Image.fromarray(_pixels(20, 30, 1)).convert('P').save(path)
    elif case == 'interlaced':
        write_png(path, _pixels(20, 30, 3), interlace=1)
    else:
        write_png(path, _pixels(20, 30, 3), extra_chunks=[_chunk(b'tRNS', b'\x00\x01\x00\x02\x00\x03')])
    assert png_layout(path) is None
    if case != 'interlaced':  # (its data is not Adam7's: only the layout is checked)
        source = ImageSource(path)
        assert isinstance(source._pixels, np.ndarray)


def test_not_a_png_is_left_to_opencv(tmp_path):
    path = str(tmp_path / 'd.jpg')
    cv2.imwrite(path, _pixels(20, 30, 3))
    assert png_layout(path) is None and open_png_bands(path) is None


def _stored_zlib(data: bytes, block: int, bad_block: int) -> bytes:
    """`data` as a zlib stream of uncompressed blocks, block number `bad_block` with a length
    that does not match its check (so inflating fails there)."""
    out = [b'\x78\x01']
    for number, start in enumerate(range(0, len(data), block)):
        piece = data[start:start + block]
        check = (~len(piece) & 0xFFFF) ^ (1 if number == bad_block else 0)
        out.append(bytes([start + block >= len(data)]) + struct.pack('<HH', len(piece), check) + piece)
    return b''.join(out) + struct.pack('>I', zlib.adler32(data))


def test_corrupt_data_past_the_first_band_fails_the_read_of_those_rows_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(png_bands, '_READ_BYTES', 1000)  # (else the whole file is inflated at once)
    pixels = _pixels(200, 64, 3)
    filtered = _filtered(pixels.reshape(200, -1), [4] * 200, 3)  # 193 bytes a row
    path = write_png(tmp_path / 'e.png', pixels, compressed=_stored_zlib(filtered, 1000, bad_block=30))
    bands = _small_bands(path, 4)
    assert np.array_equal(bands[0:150, 0:64], pixels[:150, :, ::-1])
    with pytest.raises(PngDecodeError, match=r"e\.png.*cannot be decoded"):
        bands[0:200, 0:64]


def test_corrupt_data_that_inflates_fails_the_read_of_the_last_rows(tmp_path, monkeypatch):
    """A changed byte in stored data inflates: the stream's checksum catches it, at its end, and
    the last band waits for that check."""
    monkeypatch.setattr(png_bands, '_READ_BYTES', 1000)
    pixels = _pixels(120, 64, 3)
    stream = bytearray(_stored_zlib(_filtered(pixels.reshape(120, -1), [1] * 120, 3), 1000, bad_block=-1))
    stream[len(stream) // 2] ^= 0x40
    # the checksum in a chunk of its own: all the rows are inflated before it is read
    path = write_png(tmp_path / 'f.png', pixels, compressed=bytes(stream), idat_size=len(stream) - 4)
    bands = _small_bands(path, 30)  # 4 bands: 120 rows is a whole number of them
    bands[0:90, 0:64]
    with pytest.raises(PngDecodeError, match=r"f\.png.*cannot be decoded"):
        bands[0:120, 0:64]
    with pytest.raises(ImageReadError, match=r"f\.png"):
        source = ImageSource(path)
        source.read(100, 0, 20, 64)


def test_a_truncated_file_fails_the_reads_past_its_end(tmp_path):
    path = write_png(tmp_path / 'g.png', _pixels(300, 40, 3), idat_size=400)
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:len(data) // 2])
    bands = _small_bands(path, 2)
    bands[0:10, 0:40]
    with pytest.raises(PngDecodeError, match=r"g\.png.*ends after \d+ of 300 rows"):
        bands[0:300, 0:40]


def test_a_file_whose_data_is_not_zlib_fails_at_once(tmp_path):
    path = write_png(tmp_path / 'h.png', _pixels(10, 10, 3), compressed=b'not zlib data at all')
    with pytest.raises(ImageReadError, match=r"h\.png.*cannot be decoded"):
        ImageSource(path)


def _decoding_threads():
    return [t for t in threading.enumerate() if t.name.startswith('png-')]


def test_dropping_the_bands_stops_the_decoding(tmp_path):
    path = write_png(tmp_path / 'i.png', _pixels(2000, 500, 3), idat_size=1 << 16)
    bands = _small_bands(path, 1)
    del bands
    deadline = time.monotonic() + 20
    while _decoding_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _decoding_threads()


def test_exiting_while_decoding_ends_cleanly(tmp_path):
    path = write_png(tmp_path / 'j.png', _pixels(3000, 1000, 3), idat_size=1 << 16)
    code = ('import sys; from redet_plugin.inference import ImageSource; '
            f'source = ImageSource({path!r}); sys.exit(0)')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'terminate' not in done.stderr


@pytest.mark.skipif(not hasattr(__import__('os'), 'fork'), reason='needs os.fork')
def test_a_forked_child_reads_rows_that_were_not_decoded_at_the_fork(tmp_path):
    """A data loader's worker forked while the threads run has none of them."""
    import os
    import warnings
    path = write_png(tmp_path / 'k.png', _pixels(3000, 400, 3), idat_size=1 << 16)
    expected = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    bands = _small_bands(path, 1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)  # (python 3.12: fork beside threads)
        child = os.fork()
    if child == 0:
        os._exit(0 if np.array_equal(bands[2990:3000, 0:400], expected[2990:]) else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        pytest.fail('the child waited for rows that no thread of its own decodes')
    assert os.waitstatus_to_exitcode(status) == 0
