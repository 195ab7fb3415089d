"""The exported program (redet_plugin.inference.export) gives the model's own detections."""
import numpy as np
import pytest
import torch

from redet_plugin.deploy import load, rbox_corners

from tests._helpers import full_fp32

from ._reference import assert_same_detections, model_detections, reference_model
from .conftest import CLASSES, CONFIG, IMAGE_SIZE


def deployed(found):
    return found.boxes, found.scores, found.labels


@pytest.mark.parametrize('plain', [False, True], ids=['equivariant', 'converted_to_plain'])
def test_program_gives_the_models_detections(program_package, tiny_checkpoint, images, plain):
    model = reference_model(CONFIG, tiny_checkpoint, plain=plain)
    detector = load(program_package)
    for image in images:
        assert_same_detections(deployed(detector(image)), model_detections(model, image))


def test_detections_carry_names_polygons_and_metadata(program_package, images):
    detector = load(program_package)
    assert detector.input_size == IMAGE_SIZE and detector.classes == CLASSES
    assert detector.kind == 'program' and detector.device == torch.device('cpu')
    assert detector.dtype == 'float32' and not detector.tf32  # (TF32: on a GPU only)
    found = detector(torch.from_numpy(images[0]))  # a tensor as well as an array
    assert found.class_names == [CLASSES[int(i)] for i in found.labels]
    assert found.polygons.shape == (len(found), 8)
    torch.testing.assert_close(found.polygons, rbox_corners(found.boxes))
    assert bool((found.scores[:-1] >= found.scores[1:]).all())
    assert len(found) <= detector.max_detections


def test_rbox_corners_match_the_structures_conversion():
    from redet_plugin.structures import rbox2qbox
    boxes = torch.tensor([[50.0, 40.0, 30.0, 10.0, 0.3], [10.0, 20.0, 5.0, 8.0, -1.2]])
    torch.testing.assert_close(rbox_corners(boxes), rbox2qbox(boxes))


def test_smaller_image_is_padded_and_keeps_its_pixels(program_package, images):
    detector = load(program_package)
    small = images[1][:100, :130].copy()
    padded = np.zeros_like(images[1])
    padded[:100, :130] = small
    found, ref = detector(small), detector(padded)
    assert len(ref) > 0
    assert_same_detections(deployed(found), deployed(ref))


@pytest.mark.cuda
def test_cuda_program_gives_the_models_detections(tiny_checkpoint, images, tmp_path):
    from redet_plugin.inference.export import export_detector
    path = export_detector(CONFIG, tiny_checkpoint, str(tmp_path / 'cuda.pt2'),
                           image_size=IMAGE_SIZE, device='cuda')
    model = reference_model(CONFIG, tiny_checkpoint)
    detector = load(path, tf32=False)
    assert detector.device.type == 'cuda' and detector.meta['device'] == 'cuda'
    for image in images:
        with full_fp32():
            found = detector(image)
        assert_same_detections(deployed(found), model_detections(model, image))
    assert not detector.cuda_graph  # (a program runs eagerly: see load)


@pytest.mark.cuda
def test_cuda_package_runs_its_matmuls_in_tf32_and_leaves_torchs_setting(tiny_checkpoint, images,
                                                                         tmp_path):
    from redet_plugin.inference.export import export_detector
    path = export_detector(CONFIG, tiny_checkpoint, str(tmp_path / 'cuda.pt2'),
                           image_size=IMAGE_SIZE, device='cuda')
    for tf32, during in ((True, [True]), (False, [False])):
        detector = load(path, tf32=tf32)
        assert detector.tf32 == tf32
        seen, forward = [], detector._forward
        detector._forward = lambda pixels: (
            seen.append(torch.backends.cuda.matmul.allow_tf32), forward(pixels))[1]
        with full_fp32():
            assert len(detector(images[0])) > 0
            assert seen == during and not torch.backends.cuda.matmul.allow_tf32


def test_per_level_rotated_pooling_exports_too(tiny_checkpoint, images):
    """fused=False pools each level by listing its RoIs (a data-dependent count): exported, every
    level is pooled and written, and the detections stay the model's."""
    from redet_plugin.inference.export import export_program, single_image_forward
    model = reference_model(CONFIG, tiny_checkpoint)
    model.roi_head.bbox_roi_extractor[1].fused = False
    refs = [model_detections(model, image) for image in images[:2]]
    program = export_program(single_image_forward(model, IMAGE_SIZE), 'cpu').module()
    for image, ref in zip(images, refs):
        boxes, scores, labels, count = program(torch.from_numpy(image))
        count = int(count)
        assert_same_detections((boxes[:count], scores[:count], labels[:count]), ref)
