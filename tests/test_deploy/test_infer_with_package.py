"""tools/infer.py --model: the patches, merge and outputs of infer.py with a config and
checkpoint, the model an exported package."""
import cv2
import numpy as np
import pytest

from tests.test_deploy.conftest import CONFIG

PATCH = 128  # the package's input size and the patch size: both paths see the same patches


@pytest.fixture(scope='module')
def square_package(tiny_checkpoint, tmp_path_factory):
    from redet_plugin.inference.export import export_detector
    out = str(tmp_path_factory.mktemp('square') / 'tiny_128.pt2')
    return export_detector(CONFIG, tiny_checkpoint, out, image_size=(PATCH, PATCH))


def _rows(path):
    rows = [line.split() for line in open(path).read().splitlines()]
    return sorted(rows, key=lambda row: -float(row[9]))


def test_infer_with_a_package_writes_what_the_config_and_checkpoint_give(
        tiny_checkpoint, square_package, images, tmp_path):
    from tools.infer import main
    image = cv2.resize(images[0], (260, 200))  # several overlapping patches to merge
    cv2.imwrite(str(tmp_path / 'scene.png'), image)
    patching = ['--patch-size', str(PATCH), '--patch-overlap', '32', '--device', 'cpu', '--no-vis',
                '--score-thr', '0.3']
    assert main([str(tmp_path / 'scene.png'), '--model', square_package,
                 '--out-dir', str(tmp_path / 'package'), *patching]) == []
    assert main([str(tmp_path / 'scene.png'), CONFIG, tiny_checkpoint,
                 '--out-dir', str(tmp_path / 'config'), *patching]) == []
    ours = _rows(tmp_path / 'package' / 'preds' / 'scene.txt')
    theirs = _rows(tmp_path / 'config' / 'preds' / 'scene.txt')
    assert len(ours) == len(theirs) > 5
    assert [row[8] for row in ours] == [row[8] for row in theirs]
    np.testing.assert_allclose([float(row[9]) for row in ours], [float(row[9]) for row in theirs],
                               atol=2e-3)
    np.testing.assert_allclose([[float(v) for v in row[:8]] for row in ours],
                               [[float(v) for v in row[:8]] for row in theirs], atol=0.05)


def test_infer_refuses_patches_larger_than_the_package_and_config_options(square_package,
                                                                        tmp_path):
    from tools.infer import main
    with pytest.raises(SystemExit, match=r"^error: patch_size: 256 does not fit the package's "
                                         r"input size 128x128"):
        main(['x.png', '--model', square_package, '--out-dir', str(tmp_path), '--patch-size',
              '256', '--patch-overlap', '32'])
    with pytest.raises(SystemExit):  # (argparse's usage error)
        main(['x.png', '--model', square_package, '--out-dir', str(tmp_path), '--equivariant'])
