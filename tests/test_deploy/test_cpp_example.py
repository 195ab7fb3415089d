"""The C++ example (examples/cpp): built with CMake against the torch wheel's libtorch, it runs a
compiled package on a PPM image and prints the detections the package gives from Python.

Slow: the build takes minutes (once per session; set REDET_CPP_BUILD_DIR to keep it between
sessions) and so does compiling a package. Skips only when cmake or a C++ compiler is missing;
a failed build fails with the end of its log.
"""
import importlib.util
import json
import os
import os.path as osp
import re
import shutil
import subprocess

import cv2
import numpy as np
import pytest
import torch

from tests._helpers import REPO, once_per_run

pytestmark = pytest.mark.slow

EXAMPLE = osp.join(REPO, 'examples', 'cpp')
TOY_SIZE = (64, 96)  # (H, W) of the toy package
# Printed precision of each column after the class: score, cx cy w h, angle, 8 corner coordinates.
PRINT_ATOL = np.array([5e-5] + [5e-3] * 4 + [5e-5] + [5e-3] * 8) + 1e-5


def _compiler_found() -> bool:
    return any(shutil.which(name) for name in (os.environ.get('CXX', ''), 'c++', 'g++', 'clang++')
               if name)


def _log_tail(result: subprocess.CompletedProcess, chars: int = 4000) -> str:
    return (result.stdout + result.stderr)[-chars:]


@pytest.fixture(scope='session')
def redet_infer(tmp_path_factory):
    """The path of the built redet_infer program."""
    cmake = shutil.which('cmake')
    if cmake is None:
        pytest.skip('cmake is not installed: the C++ example cannot be built')
    if not _compiler_found():
        pytest.skip('no C++ compiler (c++, g++, clang++ or $CXX) found: the C++ example cannot '
                    'be built')
    return once_per_run(tmp_path_factory, 'redet_infer', lambda: _build_redet_infer(
        cmake, os.environ.get('REDET_CPP_BUILD_DIR') or str(tmp_path_factory.mktemp('cpp_example'))))


def _build_redet_infer(cmake, build):
    configure = [cmake, '-S', EXAMPLE, '-B', build,
                 f'-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}',
                 # Unoptimised and without debug information: a third of the -O3 build time; the
                 # kernels' speed does not matter here.
                 '-DCMAKE_BUILD_TYPE=Debug', '-DCMAKE_CXX_FLAGS_DEBUG=-O0']
    if shutil.which('ninja') and not osp.exists(osp.join(build, 'CMakeCache.txt')):
        configure += ['-G', 'Ninja']
    for step in (configure, [cmake, '--build', build, '-j', str(os.cpu_count() or 2)]):
        result = subprocess.run(step, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.fail(f'building the C++ example failed ({" ".join(step)}):\n{_log_tail(result)}',
                        pytrace=False)
    return osp.join(build, 'redet_infer')


@pytest.fixture(scope='session')
def toy_package(tmp_path_factory):
    """A compiled package of examples/cpp/make_toy_package.py (about 1.5 minutes on 2 cores)."""
    spec = importlib.util.spec_from_file_location('make_toy_package',
                                                  osp.join(EXAMPLE, 'make_toy_package.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = once_per_run(tmp_path_factory, 'toy_package', lambda: module.make_toy_package(
        str(tmp_path_factory.mktemp('toy') / 'toy.pt2'), TOY_SIZE))
    return path, module.CLASSES


def run_example(program, *args):
    return subprocess.run([program, *map(str, args)], capture_output=True, text=True, timeout=300)


def printed_detections(stdout: str):
    """(class names, (K, 14) float64 columns) of redet_infer's lines."""
    rows = [line.split() for line in stdout.splitlines()]
    assert all(len(row) == 15 for row in rows), stdout
    values = np.array([[float(v) for v in row[1:]] for row in rows]).reshape(len(rows), 14)
    return [row[0] for row in rows], values


def python_detections(package: str, classes, image_bgr: np.ndarray, score_thr: float):
    """What redet_infer should print, from the same package loaded in Python (padded at the
    bottom and right to its input size, as redet_infer pads)."""
    import redet_plugin.ops  # noqa: F401  (the package calls our ops)
    from redet_plugin.deploy.polygons import rbox_corners
    model = torch._inductor.aoti_load_package(package)
    height, width = image_bgr.shape[:2]
    size_h, size_w = (int(v) for v in _input_size(model))
    padded = np.zeros((size_h, size_w, 3), np.uint8)
    padded[:height, :width] = image_bgr
    with torch.inference_mode():
        boxes, scores, labels, count = model(torch.from_numpy(padded))
    count = int(count)
    keep = scores[:count] >= score_thr
    boxes, scores, labels = boxes[:count][keep], scores[:count][keep], labels[:count][keep]
    values = torch.cat([scores[:, None], boxes, rbox_corners(boxes)], dim=1).double().numpy()
    return [classes[int(label)] for label in labels], values


def _input_size(model):
    return json.loads(model.get_metadata()['redet'])['input_size']


def assert_same_as_python(program, package, classes, image_bgr, ppm_path, score_thr):
    cv2.imwrite(str(ppm_path), image_bgr)
    result = run_example(program, package, ppm_path, '--score-thr', score_thr)
    assert result.returncode == 0, result.stderr
    names, values = printed_detections(result.stdout)
    ref_names, ref_values = python_detections(package, classes, image_bgr, score_thr)
    assert len(ref_names) > 0, 'the reference has no detections: the comparison would be empty'
    assert names == ref_names
    excess = np.abs(values - ref_values) - PRINT_ATOL
    row, column = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 0, (f'detection {row}, column {column + 1}: printed '
                               f'{values[row, column]}, Python gives {ref_values[row, column]}')
    return names


def colour_patches(height, width):
    """A dark BGR image with a red and a green rectangle (what the toy detects)."""
    image = np.full((height, width, 3), 10, np.uint8)
    image[5:20, 10:30] = (0, 0, 200)
    image[40:60, 50:70] = (0, 150, 0)
    return image


# ---- the toy package: the build, the op library and the printout ------------------------------
def test_toy_package_prints_the_python_detections(redet_infer, toy_package, tmp_path):
    package, classes = toy_package
    names = assert_same_as_python(redet_infer, package, classes, colour_patches(*TOY_SIZE),
                                  tmp_path / 'full.ppm', 0.3)
    assert set(names) == {'red', 'green'}  # the RGB file was read as BGR


def test_smaller_image_is_padded(redet_infer, toy_package, tmp_path):
    package, classes = toy_package
    image = colour_patches(*TOY_SIZE)[:50, :81]
    assert_same_as_python(redet_infer, package, classes, image, tmp_path / 'small.ppm', 0.0)


def test_score_threshold(redet_infer, toy_package, tmp_path):
    package, _ = toy_package
    cv2.imwrite(str(tmp_path / 'image.ppm'), colour_patches(*TOY_SIZE))
    result = run_example(redet_infer, package, tmp_path / 'image.ppm', '--score-thr', 0.7)
    names, values = printed_detections(result.stdout)
    assert names and set(names) == {'red'} and (values[:, 0] >= 0.7).all()


def test_ppm_header_with_comment(redet_infer, toy_package, tmp_path):
    package, classes = toy_package
    image = colour_patches(*TOY_SIZE)
    path = tmp_path / 'commented.ppm'
    rgb = np.ascontiguousarray(image[:, :, ::-1])
    header = b'P6\n# made by hand\n%d %d\n255\n' % (TOY_SIZE[1], TOY_SIZE[0])
    path.write_bytes(header + rgb.tobytes())
    result = run_example(redet_infer, package, path)
    expected = run_example(redet_infer, package, _write(tmp_path / 'cv2.ppm', image))
    assert result.returncode == 0 and result.stdout == expected.stdout and result.stdout


def _write(path, image):
    cv2.imwrite(str(path), image)
    return path


@pytest.mark.parametrize('case, status, message', [
    ('larger image', 1, r'big\.ppm is 70x96 \(HxW\), larger than the package\'s input size 64x96'),
    ('no image', 2, r'usage: redet_infer MODEL\.pt2 IMAGE\.ppm'),
    ('bad threshold', 2, r"--score-thr expects a number, got 'high'"),
    ('not a ppm', 1, r'toy\.pt2: not a binary PPM image \(P6\)'),
    ('16-bit ppm', 1, r'only 8-bit PPM images are read'),
    ('truncated ppm', 1, r'the file ends before its 64x96 \(HxW\) pixels do'),
    ('not a package', 1, r'is not a package \(not a PT2 zip archive\)'),
    ('missing package', 1, r'missing\.pt2: cannot open the file'),
])
def test_errors_are_one_line(redet_infer, toy_package, tmp_path, case, status, message):
    package, _ = toy_package
    image = _write(tmp_path / 'image.ppm', colour_patches(*TOY_SIZE))
    args = {
        'larger image': lambda: [package, _write(tmp_path / 'big.ppm',
                                                 np.zeros((70, 96, 3), np.uint8))],
        'no image': lambda: [package],
        'bad threshold': lambda: [package, image, '--score-thr', 'high'],
        'not a ppm': lambda: [package, package],
        '16-bit ppm': lambda: [package, _bytes(tmp_path / 'deep.ppm', b'P6 96 64 65535\n')],
        'truncated ppm': lambda: [package, _bytes(tmp_path / 'cut.ppm', b'P6 96 64 255\n' + bytes(9))],
        'not a package': lambda: [image, image],
        'missing package': lambda: [tmp_path / 'missing.pt2', image],
    }[case]()
    result = run_example(redet_infer, *args)
    assert result.returncode == status and result.stdout == ''
    one_line = result.stderr.count('\n') == 1 and result.stderr.startswith('redet_infer: ')
    assert one_line, result.stderr
    assert re.search(message, result.stderr), result.stderr


def _bytes(path, data):
    path.write_bytes(data)
    return path


# ---- the real exported detector ----------------------------------------------------------------
def test_exported_tiny_redet_prints_the_python_detections(redet_infer, compiled_package, images,
                                                          tmp_path):
    """The tiny ReDet exported with tools/export.py's code (conftest's compiled_package): the
    program prints what redet_plugin.deploy.load gives for the same package."""
    from redet_plugin.deploy import load
    classes = load(compiled_package).classes
    for index, image in enumerate(images):
        assert_same_as_python(redet_infer, compiled_package, classes, image,
                              tmp_path / f'image{index}.ppm', 0.0)
