"""What load and a DeployedDetector refuse, each with one line naming both sides."""
import json
import zipfile

import numpy as np
import pytest
import torch

import redet_plugin
from redet_plugin.deploy import NotAPackageError, PackageMismatchError, load

from .conftest import IMAGE_SIZE


def one_line(error_info) -> str:
    message = str(error_info.value)
    assert '\n' not in message, message
    return message


def with_metadata(src: str, dst: str, drop=(), **changes) -> str:
    """A copy of the package whose metadata has `changes` and lacks the keys `drop`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, 'w') as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith('extra/redet.json'):
                meta = dict(json.loads(data), **changes)
                data = json.dumps({k: v for k, v in meta.items() if k not in drop}).encode()
            zout.writestr(info, data)
    return dst


def test_larger_image_is_refused_naming_both_sizes(program_package):
    detector = load(program_package)
    height, width = IMAGE_SIZE
    with pytest.raises(ValueError) as error:
        detector(np.zeros((height + 1, width, 3), np.uint8))
    assert one_line(error).startswith(f"image: {height + 1}x{width} (HxW) is larger than the "
                                      f"package's input size {height}x{width}")


@pytest.mark.parametrize('image', [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 4), np.uint8),
                                   np.zeros((8, 8, 3), np.float32)], ids=['gray', 'bgra', 'float'])
def test_image_that_is_no_bgr_uint8_is_refused(program_package, image):
    with pytest.raises(ValueError, match=r'^image: expected \(H, W, 3\) uint8 BGR pixels, got shape'):
        load(program_package)(image)


def test_image_of_another_type_is_refused(program_package):
    with pytest.raises(TypeError, match=r'^image: expected an \(H, W, 3\) uint8 numpy array or '
                                        r'tensor, got list'):
        load(program_package)([[0, 0, 0]])


@pytest.mark.parametrize('key', ['torch', 'plugin'])
def test_package_of_another_version_is_refused(program_package, tmp_path, key):
    other = with_metadata(program_package, str(tmp_path / 'other.pt2'), **{key: '0.0.1'})
    with pytest.raises(PackageMismatchError) as error:
        load(other)
    made = ('0.0.1', redet_plugin.__version__) if key == 'torch' else (torch.__version__, '0.0.1')
    assert one_line(error).startswith(
        f"package {other!r} was exported with torch {made[0]} and redet_plugin {made[1]}; this "
        f"is torch {torch.__version__} and redet_plugin {redet_plugin.__version__}")


def test_package_for_another_device_is_refused(program_package, tmp_path):
    with pytest.raises(ValueError) as error:
        load(program_package, device='cuda')
    assert one_line(error).startswith(f"device: package {program_package!r} was exported for "
                                      f"cpu, not cuda")
    with pytest.raises(ValueError, match=r"^device: expected 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        load(program_package, device='gpu')
    for_cuda = with_metadata(program_package, str(tmp_path / 'cuda.pt2'), device='cuda')
    with pytest.raises(ValueError, match=r'^device: .* was exported for cuda, not cpu'):
        load(for_cuda, device='cpu')
    if not torch.cuda.is_available():
        with pytest.raises(PackageMismatchError) as error:
            load(for_cuda)
        assert one_line(error).endswith('was exported for cuda, and torch sees no CUDA device here')


def test_file_that_is_no_package_is_refused(tmp_path, tiny_checkpoint):
    text = tmp_path / 'notes.pt2'
    text.write_text('not a package')
    with pytest.raises(NotAPackageError) as error:
        load(str(text))
    assert one_line(error).startswith(f"{str(text)!r} is not an exported ReDet package")
    with pytest.raises(NotAPackageError, match=r"^package '.*missing\.pt2' does not exist$"):
        load(str(tmp_path / 'missing.pt2'))
    # a checkpoint is a zip archive too, without the metadata
    with pytest.raises(NotAPackageError) as error:
        load(tiny_checkpoint)
    assert one_line(error).endswith('is a PT2 archive without ReDet metadata (not written by '
                                    'tools/export.py)')


def test_metadata_without_a_key_is_refused(program_package, tmp_path):
    broken = with_metadata(program_package, str(tmp_path / 'broken.pt2'), drop=('classes',))
    with pytest.raises(NotAPackageError, match=r"^'.*broken\.pt2': its ReDet metadata lacks classes$"):
        load(broken)


@pytest.mark.parametrize('name', ['cuda_graph', 'tf32'])
def test_switch_that_is_no_bool_is_refused(program_package, name):
    with pytest.raises(TypeError, match=rf"^{name}: expected True or False, got 'yes'$"):
        load(program_package, **{name: 'yes'})
