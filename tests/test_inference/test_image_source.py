"""ImageSource: region reads as 3-channel 8-bit BGR, memory-mapped where the file allows it,
grayscale and 16-bit conversion, one-line errors."""
import cv2
import numpy as np
import pytest
from PIL import Image

from redet_plugin.inference import ImageReadError, ImageSource
from redet_plugin.inference.patches import read_patch
from redet_plugin.structures.patch_grid import Patch, pad_patch, plan_patches

RNG = np.random.default_rng(0)
COLOUR = RNG.integers(0, 256, (70, 90, 3)).astype(np.uint8)
GRAY16 = RNG.integers(0, 4096, (70, 90)).astype(np.uint16)  # 12-bit data in 16 bits


def stretched(gray16):
    return np.rint(gray16.astype(np.float64) * 255 / gray16.max()).astype(np.uint8)


@pytest.mark.parametrize('name,write,mapped', [
    ('rgb.tif', lambda p: Image.fromarray(COLOUR[:, :, ::-1]).save(p), True),
    ('rgb.bmp', lambda p: Image.fromarray(COLOUR[:, :, ::-1]).save(p), True),  # rows bottom-up
    ('rgb.ppm', lambda p: Image.fromarray(COLOUR[:, :, ::-1]).save(p), True),
    ('lzw.tif', lambda p: cv2.imwrite(p, COLOUR), False),
    ('rgb.png', lambda p: cv2.imwrite(p, COLOUR), False),
])
def test_colour_files_read_by_region(tmp_path, name, write, mapped):
    path = str(tmp_path / name)
    write(path)
    source = ImageSource(path)
    assert source.memory_mapped == mapped and source.shape == (70, 90) and source.name == name[:-4]
    np.testing.assert_array_equal(source.read(5, 7, 40, 50), COLOUR[5:45, 7:57])
    np.testing.assert_array_equal(source.read(60, 80, 40, 50), COLOUR[60:, 80:])  # clipped


@pytest.mark.parametrize('name,write,mapped', [
    ('g16.tif', lambda p: Image.fromarray(GRAY16).save(p), True),
    ('g16.png', lambda p: cv2.imwrite(p, GRAY16), False),
])
def test_16_bit_grayscale_is_stretched_by_the_image_peak(tmp_path, name, write, mapped):
    path = str(tmp_path / name)
    write(path)
    source = ImageSource(path)
    assert source.memory_mapped == mapped
    region = source.read(10, 20, 30, 40)
    assert region.dtype == np.uint8 and region.shape == (30, 40, 3)
    expected = stretched(GRAY16)[10:40, 20:60]
    for channel in range(3):
        np.testing.assert_array_equal(region[:, :, channel], expected)


def test_grayscale_and_alpha():
    gray = COLOUR[:, :, 0]
    np.testing.assert_array_equal(ImageSource(gray).read(0, 0, 70, 90), np.dstack([gray] * 3))
    np.testing.assert_array_equal(ImageSource(gray[:, :, None]).read(0, 0, 70, 90), np.dstack([gray] * 3))
    bgra = np.dstack([COLOUR, np.full((70, 90), 7, np.uint8)])
    np.testing.assert_array_equal(ImageSource(bgra).read(0, 0, 70, 90), COLOUR)
    full16 = (COLOUR.astype(np.uint16) * 257)
    full16[0, 0] = 65535  # a full-range 16-bit image is the 8-bit one times 257
    expected = COLOUR.copy()
    expected[0, 0] = 255
    np.testing.assert_array_equal(ImageSource(full16).read(0, 0, 70, 90), expected)


def test_errors_are_one_line_naming_the_image(tmp_path):
    bad = tmp_path / 'bad.png'
    bad.write_bytes(b'not an image')
    cases = [(str(tmp_path / 'missing.png'), 'missing.png.*does not exist'),
             (str(bad), 'bad.png.*cannot be read'),
             (str(tmp_path), 'is not a file'),
             (np.zeros((4, 4), np.float32), 'pixel type float32'),
             (np.zeros((0, 4, 3), np.uint8), 'empty'),
             (np.zeros((4, 4, 5), np.uint8), 'shape')]
    for image, message in cases:
        with pytest.raises(ImageReadError, match=message) as error:
            ImageSource(image)
        assert '\n' not in str(error.value)


@pytest.mark.parametrize('scale', [1.0, 0.5, 0.37, 1.5])
def test_patches_equal_cutting_the_resized_image(scale):
    """read_patch resamples each patch from its source region; the result is the patch of the
    whole image resized as dota_split resizes it (to within one grey level, OpenCV's
    fixed-point rounding)."""
    image = cv2.GaussianBlur(RNG.integers(0, 256, (300, 410, 3)).astype(np.uint8), (0, 0), 2)
    resized = image if scale == 1 else cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    patches = plan_patches(300, 410, 128, 40, [scale])
    for patch in patches:
        expected = pad_patch(resized[patch.top:patch.top + 128, patch.left:patch.left + 128], 128)
        got = read_patch(ImageSource(image), patch, 128)
        assert np.abs(got.astype(int) - expected).max() <= (0 if scale == 1 else 1)


def test_plan_uses_dota_splits_grid():
    from redet_plugin.datasets import patch_windows
    patches = plan_patches(1000, 2500, 1024, 200, [1.0, 0.5])
    assert [p for p in patches if p.scale == 1.0] == [Patch(1.0, l, t) for l, t in patch_windows(1000, 2500, 1024, 200)]
    assert [p for p in patches if p.scale == 0.5] == [Patch(0.5, 0, 0), Patch(0.5, 226, 0)]
