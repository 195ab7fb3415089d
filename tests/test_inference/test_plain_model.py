"""make_plain: the equivariant backbone and neck as plain convolutions with folded batch norms
give the detections of the e2cnn modules (up to float rounding), for RotatedDetector by default."""
import numpy as np
import pytest
import torch

from redet_plugin.inference.plain_model import make_plain
from redet_plugin.models.layers.equivariant import EquivariantNetwork
from tests._helpers import make_samples, tiny_detector


def _detections(model, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (1, 3, 128, 128), generator=g).float()
    with torch.no_grad():
        return model.predict(x, make_samples(1, 128, (0,)))[0].pred_instances


def test_plain_model_gives_the_equivariant_detections():
    equivariant = tiny_detector().eval()
    equivariant.test_cfg.rcnn.score_thr = 0.0  # (an untrained model's detections, many)
    plain = tiny_detector()
    plain.test_cfg.rcnn.score_thr = 0.0
    assert make_plain(plain) == 2  # backbone and neck
    assert not plain.training
    kinds = {type(m).__name__ for m in plain.backbone.modules()} | \
        {type(m).__name__ for m in plain.neck.modules()}
    assert 'BatchNorm2d' not in kinds and not any(k.startswith('R2Conv') for k in kinds)
    for seed in range(2):
        ours, theirs = _detections(plain, seed), _detections(equivariant, seed)
        assert len(ours) == len(theirs) > 10
        assert torch.equal(ours.labels, theirs.labels)
        torch.testing.assert_close(ours.scores, theirs.scores, rtol=0, atol=1e-5)
        scale = theirs.bboxes.abs().amax(dim=1, keepdim=True)
        assert ((ours.bboxes - theirs.bboxes).abs() <= 1e-3 * scale).all()
    assert make_plain(plain) == 0  # (nothing left to convert)


def test_rotated_detector_is_plain_by_default_with_the_same_detections():
    from tests.test_tools.test_infer_tool import CONFIG
    from redet_plugin.inference import RotatedDetector
    image = np.random.default_rng(0).integers(0, 256, (128, 128, 3)).astype(np.uint8)
    detectors = []
    for plain in (True, False):
        torch.manual_seed(0)  # (the same initial weights: no checkpoint)
        detectors.append(RotatedDetector(CONFIG, None, device='cpu', patch_size=128, patch_overlap=32,
                                         score_thr=0.0, plain=plain))
    converted = [any(isinstance(m, EquivariantNetwork) and m.exported for m in d.model.modules())
                 for d in detectors]
    assert converted == [True, False]
    ours, theirs = (d.predict(image) for d in detectors)
    assert len(ours) == len(theirs) > 10
    np.testing.assert_array_equal(ours.labels, theirs.labels)
    np.testing.assert_allclose(ours.scores, theirs.scores, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.boxes, theirs.boxes, rtol=1e-3, atol=1e-3)


def test_half_keeps_the_plain_convolutions_in_fp16_and_nothing_else():
    model = tiny_detector()
    assert make_plain(model, half=True) == 2
    networks = [model.backbone, model.neck]
    convs = [m for net in networks for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(p.dtype == torch.float16 for c in convs for p in c.parameters())
    in_networks = {id(p) for net in networks for p in net.parameters()}
    others = [p for p in model.parameters() if id(p) not in in_networks]
    assert others and all(p.dtype == torch.float32 for p in others)


@pytest.mark.cuda
def test_half_gives_the_detections_of_autocasts_own_casts():
    """Under fp16 autocast, the weights stored in fp16 are the ones autocast would cast."""
    found = []
    for half in (False, True):
        model = tiny_detector().cuda()
        model.test_cfg.rcnn.score_thr = 0.0
        make_plain(model, half=half)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (1, 3, 128, 128), generator=g).float().cuda()
        with torch.no_grad(), torch.autocast('cuda', torch.float16):
            found.append(model.predict(x, make_samples(1, 128, (0,)))[0].pred_instances)
    ours, theirs = found[1], found[0]
    assert len(ours) == len(theirs) > 10
    assert torch.equal(ours.labels, theirs.labels)
    torch.testing.assert_close(ours.scores, theirs.scores, rtol=0, atol=1e-3)
    torch.testing.assert_close(ours.bboxes, theirs.bboxes, rtol=1e-3, atol=1e-2)
