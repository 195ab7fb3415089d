"""The AOTInductor-compiled package gives the model's own detections (slow: it compiles C++;
deselect with -m 'not slow')."""
import pytest

from redet_plugin.deploy import load
from tests._helpers import full_fp32

from ._reference import (assert_matching_detections, assert_same_detections, model_detections,
                         reference_model)
from .conftest import CLASSES, CONFIG, IMAGE_SIZE

pytestmark = pytest.mark.slow


def test_compiled_package_gives_the_models_detections(compiled_package, tiny_checkpoint, images):
    model = reference_model(CONFIG, tiny_checkpoint)
    detector = load(compiled_package)
    assert detector.kind == 'compiled' and detector.classes == CLASSES
    assert detector.input_size == IMAGE_SIZE
    for image in images:
        found = detector(image)
        assert_same_detections((found.boxes, found.scores, found.labels),
                               model_detections(model, image))


def test_compiled_package_refuses_another_device(compiled_package):
    with pytest.raises(ValueError, match=r"^device: package '.*' was exported for cpu, not cuda"):
        load(compiled_package, device='cuda')


@pytest.mark.cuda
def test_cuda_compiled_package_gives_the_models_detections(tiny_checkpoint, images, tmp_path):
    from redet_plugin.inference.export import export_detector
    path = export_detector(CONFIG, tiny_checkpoint, str(tmp_path / 'cuda.pt2'),
                           image_size=IMAGE_SIZE, device='cuda', compile=True)
    model = reference_model(CONFIG, tiny_checkpoint)
    for cuda_graph in (True, False):
        detector = load(path, cuda_graph=cuda_graph, tf32=False)
        assert detector.device.type == 'cuda'
        for image in images:  # one after another: the graph's input is each image's
            with full_fp32():
                found = detector(image)
            assert_same_detections((found.boxes, found.scores, found.labels),
                                   model_detections(model, image))
        assert detector.cuda_graph == cuda_graph


@pytest.mark.cuda
@pytest.mark.parametrize('compile', [False, True])
def test_cuda_float16_package_gives_the_models_amp_detections(tiny_checkpoint, images, tmp_path,
                                                               compile):
    """--dtype float16 is the model under fp16 autocast (tools/test.py --amp). The program runs
    autocast's own kernels: every detection within 1e-2. The compiled package's fused kernels
    round fp16 at other places, which the tiny checkpoint's classifier (scaled by 100) amplifies:
    three quarters of the detections within 5e-2."""
    import torch
    from redet_plugin.inference.export import export_detector
    path = export_detector(CONFIG, tiny_checkpoint, str(tmp_path / 'half.pt2'),
                           image_size=IMAGE_SIZE, device='cuda', dtype='float16', compile=compile)
    model = reference_model(CONFIG, tiny_checkpoint).cuda()
    detector = load(path)
    assert detector.dtype == 'float16' and detector.meta['dtype'] == 'float16'
    for image in images:
        found = detector(image)
        assert found.boxes.dtype == found.scores.dtype == torch.float32
        with torch.autocast('cuda', torch.float16):
            ref = [t.cpu() for t in model_detections(model, image)]
        assert_matching_detections((found.boxes, found.scores, found.labels), ref,
                                   tolerance=5e-2 if compile else 1e-2,
                                   min_share=0.75 if compile else 1.0)
