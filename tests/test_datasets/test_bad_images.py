"""Images that cannot be read (redet_plugin/datasets/bad_images.py): found when the data set is
listed or when an image is loaded, named in one line, or left out with on_bad_image='skip'."""
import warnings

import cv2
import numpy as np
import pytest
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (BadImageError, DOTAAnnotationWarning, DOTADataError, DOTADataset,
                                   HRSCDataset, generate_synthetic_hrsc, image_file_problem)

init_default_scope('mmdet')
PIPELINE = [dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
            dict(type='PackDetInputs')]


def _image(path, size=(48, 64)):
    rng = np.random.default_rng(0)
    cv2.imwrite(str(path), rng.integers(0, 255, (*size, 3), dtype=np.uint8))
    return path


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def _break_pixels(path):
    """A PNG whose image data is damaged but whose ends (signature, IEND) are whole: found only
    when the pixels are decoded."""
    data = bytearray(path.read_bytes())
    start = data.index(b'IDAT') + 8
    data[start:start + 64] = bytes(64)
    path.write_bytes(bytes(data))


def write_set(root, stems=('a', 'b', 'c')):
    (root / 'images').mkdir(parents=True)
    (root / 'labelTxt').mkdir()
    for stem in stems:
        _image(root / 'images' / f'{stem}.png')
        (root / 'labelTxt' / f'{stem}.txt').write_text('10 10 30 10 30 20 10 20 plane 0\n')
    return root


def build(root, **kwargs):
    return DOTADataset(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='images'),
                       metainfo=dict(classes=('plane',)), pipeline=kwargs.pop('pipeline', PIPELINE),
                       **kwargs)


@pytest.mark.parametrize('suffix', ['png', 'jpg'])
def test_file_problems(tmp_path, suffix):
    good = _image(tmp_path / f'good.{suffix}', (200, 300))
    assert image_file_problem(str(good)) is None
    cut = tmp_path / f'cut.{suffix}'
    cut.write_bytes(good.read_bytes()[:-200])
    assert 'cut short' in image_file_problem(str(cut))
    empty = tmp_path / f'empty.{suffix}'
    empty.write_bytes(b'')
    assert image_file_problem(str(empty)) == 'the file is empty (0 bytes)'
    assert image_file_problem(str(tmp_path / f'missing.{suffix}')) == 'the file does not exist'
    padded = tmp_path / f'padded.{suffix}'  # bytes after the end: still a whole image
    padded.write_bytes(good.read_bytes() + bytes(100))
    assert image_file_problem(str(padded)) is None


def test_a_cut_jpeg_with_a_thumbnail_end_marker_is_found(tmp_path):
    """The end marker of an EXIF thumbnail (inside APP1) is not the image's."""
    data = _image(tmp_path / 'a.jpg', (200, 300)).read_bytes()
    thumbnail = b'Exif\x00\x00' + b'\xff\xd8' + bytes(20) + b'\xff\xd9'
    app1 = b'\xff\xe1' + (len(thumbnail) + 2).to_bytes(2, 'big') + thumbnail
    with_thumbnail = data[:2] + app1 + data[2:]
    (tmp_path / 'b.jpg').write_bytes(with_thumbnail)
    assert image_file_problem(str(tmp_path / 'b.jpg')) is None
    (tmp_path / 'c.jpg').write_bytes(with_thumbnail[:-300])
    assert 'cut short' in image_file_problem(str(tmp_path / 'c.jpg'))


@pytest.mark.parametrize('damage, reason', [
    (lambda p: p.write_bytes(b''), r'the file is empty \(0 bytes\)'),
    (_cut, r'the PNG is cut short'),
    (lambda p: p.write_bytes(b'not an image at all'), r'not an image PIL can identify'),
])
def test_a_bad_image_is_named_when_listed(tmp_path, damage, reason):
    root = write_set(tmp_path)
    damage(root / 'images' / 'b.png')
    with pytest.raises(BadImageError, match=rf"^DOTADataset: image '.*images/b\.png' cannot be read: {reason}"):
        build(root)
    assert issubclass(BadImageError, DOTADataError)  # (tools print DOTADataError as one line)
    with pytest.warns(DOTAAnnotationWarning, match=r'skipped: image .*b\.png'):
        dataset = build(root, on_bad_image='skip')
    assert [dataset.get_data_info(i)['img_id'] for i in range(len(dataset))] == ['a', 'c']
    assert len(dataset.skipped_images) == 1 and 'b.png' in dataset.skipped_images[0]


def test_a_missing_image_is_skipped_with_on_bad_image_skip(tmp_path):
    root = write_set(tmp_path)
    (root / 'images' / 'c.png').unlink()
    with pytest.raises(DOTADataError, match=r'labelTxt/c\.txt: no image c\.'):
        build(root)
    with pytest.warns(DOTAAnnotationWarning):
        dataset = build(root, on_bad_image='skip')
    assert len(dataset) == 2 and 'missing' in dataset.skipped_images[0]


def test_every_image_bad_is_one_error(tmp_path):
    root = write_set(tmp_path)
    for stem in 'abc':
        (root / 'images' / f'{stem}.png').write_bytes(b'')
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(
            DOTADataError, match=r'none of the 3 annotation files .* \(3 images left out as unreadable\)'):
        build(root, on_bad_image='skip')


def test_an_image_that_fails_to_decode_is_named_when_loaded(tmp_path):
    root = write_set(tmp_path)
    _break_pixels(root / 'images' / 'b.png')
    dataset = build(root)  # its ends are whole: listed
    with pytest.raises(BadImageError, match=r"^DOTADataset: image '.*b\.png' cannot be read: "
                                            r"its image data cannot be decoded"):
        dataset[1]


def test_training_skips_an_image_that_fails_to_decode_and_says_so_in_the_batch(tmp_path):
    root = write_set(tmp_path)
    _break_pixels(root / 'images' / 'b.png')
    dataset = build(root, on_bad_image='skip')
    with pytest.warns(DOTAAnnotationWarning, match=r'skipped: image .*b\.png'):
        data = dataset[1]
    assert data['data_samples'].img_id in ('a', 'c')  # another image instead
    assert 'b.png' in data['data_samples'].skipped_images[0]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert 'skipped_images' not in dataset[0]['data_samples']  # reported once
    assert len(dataset.skipped_images) >= 1


def test_a_test_set_cannot_skip_an_image_once_begun(tmp_path):
    root = write_set(tmp_path)
    _break_pixels(root / 'images' / 'b.png')
    dataset = build(root, on_bad_image='skip', test_mode=True)
    with pytest.raises(BadImageError, match=r"b\.png' cannot be read: .*a test cannot leave an image out"):
        dataset[1]


def test_bad_argument(tmp_path):
    with pytest.raises(ValueError, match=r"on_bad_image must be one of \['error', 'skip'\], got 'warn'"):
        build(write_set(tmp_path), on_bad_image='warn')


def test_hrsc_names_an_image_that_cannot_be_loaded(tmp_path):
    generate_synthetic_hrsc(str(tmp_path), num_trainval=2, num_test=1, image_size=64)
    image = tmp_path / 'FullDataSet' / 'AllImages' / 'trainval_00001.bmp'
    _cut(image)
    dataset = HRSCDataset(data_root=str(tmp_path), ann_file='ImageSets/trainval.txt',
                          data_prefix=dict(sub_data_root='FullDataSet/'), pipeline=PIPELINE)
    with pytest.raises(BadImageError, match=r"^HRSCDataset: image '.*trainval_00001\.bmp' cannot be read"):
        dataset[1]
