"""mmrotate's ReDet checkpoints in our ReDet, and ours in mmrotate (mmrotate-dev 1.0.1).

mmrotate's ReDet R50 (its own config, redet-le90_re50_refpn_1x_dota.py) gets our weights converted
as tools/model_converters/redet_to_mmrotate.py does (a strict load), is trained one iteration on
the CPU by an mmengine Runner (which saves epoch_1.pth exactly as mmrotate's training does), and
that file must load into our configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py with
no manual step and give mmrotate's detections (on the CPU compared in float64: predict_float64).
mmcv's RiRoIAlignRotated has no CPU kernel, so on the CPU mmrotate's stage 2 runs ours with
legacy_orientation=True (bit-compatible with mmcv's, tests/test_ops); the CUDA test uses mmcv's
own kernel. R50 models are built once per module; images are 256 x 256.
mmrotate's models are built from plain e2cnn R2Convs, which share one basis per process: every one
built here gets its own (isolate_e2cnn_bases), so moving one to the GPU moves no other.
"""
import copy
import importlib
import os
import os.path as osp
import pickle
from unittest import mock

import cv2
import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import get_box_tensor
from mmengine.config import Config
from mmengine.device import get_device
from mmengine.logging import HistoryBuffer
from mmengine.registry import DefaultScope, init_default_scope
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner import runner as mmengine_runner

from tests._helpers import REPO, full_fp32, register_mmrotate

register_mmrotate()
import e2cnn.nn.init  # noqa: E402
import mmrotate  # noqa: E402
import redet_plugin.mm  # noqa: E402,F401
from mmrotate.registry import MODELS as MMROTATE_MODELS  # noqa: E402
from redet_plugin.models import isolate_e2cnn_bases  # noqa: E402
from redet_plugin.models.necks import ReFPN  # noqa: E402
from redet_plugin.ops import RiRoIAlignRotated  # noqa: E402

mmcv_nms = importlib.import_module('mmcv.ops.nms')  # the module (mmcv.ops.nms is also a function)
OUR_CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py')
TINY_CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')
MMROTATE_CONFIG = osp.join(osp.dirname(mmrotate.__file__),
                           '.mim/configs/redet/redet-le90_re50_refpn_1x_dota.py')
SIZE = 256
CACHE_KEYS = ('filter', 'expanded_bias')  # e2cnn's expanded filters, which mmrotate saves


def build_mmrotate_redet(mmcv_kernel: bool = False) -> torch.nn.Module:
    """mmrotate's ReDet from its own config, with its own e2cnn bases; in stage 2 our RiRoIAlign
    (legacy mode, runs on the CPU) or with `mmcv_kernel` mmcv's (CUDA only). e2cnn's He init is
    skipped (its Python loop is most of the build time): weights come later."""
    from mmcv import ops
    cfg = Config.fromfile(MMROTATE_CONFIG)
    cfg.model.backbone.init_cfg = None  # the ImageNet file is not here
    with DefaultScope.overwrite_default_scope('mmrotate'), \
            mock.patch.object(e2cnn.nn.init, 'generalized_he_init', lambda *args, **kwargs: None):
        model = MMROTATE_MODELS.build(cfg.model)
    extractor = model.roi_head.bbox_roi_extractor[1]
    extractor.roi_layers = torch.nn.ModuleList(
        ops.RiRoIAlignRotated(out_size=7, spatial_scale=1 / s, num_samples=2, num_orientations=8,
                              clockwise=True) if mmcv_kernel else
        RiRoIAlignRotated(7, 1 / s, num_samples=2, num_orientations=8, clockwise=True,
                          legacy_orientation=True) for s in extractor.featmap_strides)
    return isolate_e2cnn_bases(model)


def write_dota_folder(root: str, image: np.ndarray) -> None:
    """One image and its annotation as mmrotate's DOTADataset reads them (no header lines)."""
    for sub in ('images', 'annfiles'):
        os.makedirs(osp.join(root, sub), exist_ok=True)
    cv2.imwrite(osp.join(root, 'images', 'P0001.png'), image)
    objects = [('20 30 90 30 90 60 20 60', 'plane'), ('150 120 200 170 180 190 130 140', 'ship'),
               ('60 180 120 180 120 230 60 230', 'storage-tank')]
    with open(osp.join(root, 'annfiles', 'P0001.txt'), 'w') as f:
        f.write(''.join(f'{poly} {name} 0\n' for poly, name in objects))


def predict(model, image: np.ndarray):
    """(boxes (N, 5), scores, labels) of model.test_step on one BGR image, as a Runner feeds it."""
    inputs = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    sample = DetDataSample(metainfo=dict(img_shape=image.shape[:2], ori_shape=image.shape[:2],
                                         scale_factor=(1.0, 1.0)))
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.test_step(dict(inputs=[inputs.to(device)], data_samples=[sample]))[0]
    out = out.pred_instances
    return get_box_tensor(out.bboxes).cpu(), out.scores.cpu(), out.labels.cpu()


def predict_float64(model, image: np.ndarray):
    """predict() with the model in float64 on the CPU (and back in float32 after): in float32 two
    models summing in different orders differ by up to 3e-5 in a score on the GPU machine's CPU (but
    not on the CI machine's), past any tolerance that still means "the same weights"; in float64
    they agree to 1e-13. mmcv's CPU NMS takes float32 only: the RPN's boxes are rounded for it
    (the same boxes in both models round alike)."""
    inputs = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    sample = DetDataSample(metainfo=dict(img_shape=image.shape[:2], ori_shape=image.shape[:2],
                                         scale_factor=(1.0, 1.0)))
    nms_float32 = mmcv_nms.ext_module.nms
    assert not model.training
    model.double()
    # e2cnn's eval-mode filters expanded again, in float64 (.double() only converts the float32
    # ones, while ours are expanded again on conversion)
    model.train().eval()
    try:
        with torch.no_grad(), mock.patch.object(
                mmcv_nms.ext_module, 'nms',
                lambda boxes, scores, **kw: nms_float32(boxes.float(), scores.float(), **kw)):
            data = model.data_preprocessor(dict(inputs=[inputs], data_samples=[sample]), False)
            out = model.predict(data['inputs'].double(), data['data_samples'])[0].pred_instances
    finally:
        model.float().train().eval()
    return get_box_tensor(out.bboxes), out.scores, out.labels


# Ours and mmrotate's model in float32: they compute the same function with different kernels
# (e2cnn's filter expansion, our fused RoI extractor, convolutions on channels-last maps), whose
# sums run in different orders, and cuDNN picks per model.
MODEL_TOLERANCE = dict(box_atol=1e-3, score_atol=1e-5)


def nearest_of_label(i, labels, their_labels, distance, score_diff, box_diff, free):
    """What a failed match says of their detections of our detection i's label."""
    same_label = torch.where(their_labels == labels[i])[0]
    if len(same_label) == 0:
        return 'they have none of that label'
    k = int(same_label[distance[i, same_label].argmin()])
    return (f'their nearest of that label: {k}, |score diff| {float(score_diff[i, k]):.3g}, '
            f'|box diff| {float(box_diff[i, k]):.3g}{"" if free[k] else " (already taken)"}')


def assert_same_detections(ours, theirs, box_atol=1e-4, score_atol=1e-6):
    """The same detections in any order (equal scores may come out in either order on another
    machine): every one of ours paired with a different one of theirs of the same label, its score
    within score_atol and every box number within box_atol."""
    (boxes, scores, labels), (their_boxes, their_scores, their_labels) = ours, theirs
    assert len(scores) == len(their_scores) > 10
    score_diff = (scores[:, None] - their_scores[None, :]).abs()
    box_diff = (boxes[:, None, :] - their_boxes[None, :, :]).abs().amax(dim=-1)
    allowed = ((labels[:, None] == their_labels[None, :]) & (score_diff <= score_atol)
               & (box_diff <= box_atol))
    # one-to-one, greedily: each of ours takes the nearest free allowed one of theirs
    distance = score_diff / score_atol + box_diff / box_atol
    cost = torch.where(allowed, distance, torch.full_like(score_diff, float('inf')))
    cols, free = [], torch.ones(len(their_scores), dtype=torch.bool)
    for i in range(len(scores)):
        j = int(torch.where(free, cost[i], torch.full_like(cost[i], float('inf'))).argmin())
        if not (allowed[i, j] and free[j]):
            raise AssertionError(
                f'our detection {i} (label {int(labels[i])}, score {float(scores[i]):.6g}, box '
                f'{boxes[i].tolist()}) has no counterpart; '
                + nearest_of_label(i, labels, their_labels, distance, score_diff, box_diff, free))
        free[j] = False
        cols.append(j)
    rows, cols = torch.arange(len(scores)), torch.tensor(cols)
    print(f'{len(scores)} detections; max |box diff| {box_diff[rows, cols].max():.3g}, '
          f'max |score diff| {score_diff[rows, cols].max():.3g}')


def to_our_key(key: str) -> str:
    """mmrotate's key of the default R50 ReDet under our name (the neck nests one level less)."""
    for name in ('lateral_convs', 'fpn_convs'):
        if key.startswith(f'neck.{name}.'):
            return key.replace('.conv.', '.', 1)
    return key


@pytest.fixture(scope='module')
def image():
    rng = np.random.RandomState(0)
    coarse = rng.randint(0, 256, (16, 16, 3)).astype(np.uint8)
    return cv2.resize(coarse, (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)


@pytest.fixture(scope='module')
def dota_folder(image, tmp_path_factory):
    root = str(tmp_path_factory.mktemp('dota'))
    write_dota_folder(root, image)
    return root


@pytest.fixture(scope='module')
def ours():
    """Our ReDet R50 (mmrotate's orientation mode) with its layers' initial weights, biases and
    BN statistics moved off their initial values so that every weight matters."""
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(OUR_CONFIG).model)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name.endswith('running_var'):
                value.uniform_(0.5, 1.5)
            elif name.endswith(('bias', 'running_mean')) or (
                    'batch_norm' in name and name.endswith('weight')):
                value.add_(0.1 * torch.randn_like(value))
    model.load_state_dict(model.state_dict())  # refreshes e2cnn's eval-mode filter caches
    return model.eval()


@pytest.fixture(scope='module')
def theirs(ours, tmp_path_factory):
    """mmrotate's ReDet holding our weights, converted as
    tools/model_converters/redet_to_mmrotate.py does (its command line: test_converters_round_trip)
    and loaded strictly by mmengine."""
    from tools.model_converters.redet_to_mmrotate import to_mmrotate_state_dict
    path = str(tmp_path_factory.mktemp('converted') / 'mmrotate.pth')
    torch.save({'meta': {}, 'state_dict': to_mmrotate_state_dict(ours)}, path)
    model = build_mmrotate_redet()
    load_checkpoint(model, path, map_location='cpu', strict=True)
    return model


@pytest.fixture(scope='module')
def mmrotate_checkpoint(theirs, dota_folder, tmp_path_factory):
    """One iteration of mmrotate's training (its config's optimizer, schedule and hooks) on the
    one-image DOTA folder (at half size: cheaper); mmengine's CheckpointHook saves epoch_1.pth.
    `theirs` is trained."""
    cfg = Config.fromfile(MMROTATE_CONFIG)
    pipeline = [dict(type='mmdet.LoadImageFromFile'),
                dict(type='mmdet.LoadAnnotations', with_bbox=True, box_type='qbox'),
                dict(type='ConvertBoxType', box_type_mapping=dict(gt_bboxes='rbox')),
                dict(type='mmdet.Resize', scale=(SIZE // 2, SIZE // 2), keep_ratio=True),
                dict(type='mmdet.PackDetInputs')]
    work_dir = str(tmp_path_factory.mktemp('mmrotate_work'))
    # On the CPU on every machine: a GPU's backward is not deterministic, so the weights would
    # change from run to run, and with them the near-ties that the final NMS may break either way
    # between two models whose boxes differ in the last bit. The Runner moves the model to
    # get_device() when it is built, so the CPU is patched in for both building and training.
    with mock.patch.object(mmengine_runner, 'get_device', lambda: 'cpu'):
        runner = Runner(
            model=theirs, work_dir=work_dir, cfg=cfg, default_scope='mmrotate',
            train_dataloader=dict(
                batch_size=1, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
                dataset=dict(type='DOTADataset', data_root=dota_folder, ann_file='annfiles/',
                             data_prefix=dict(img_path='images/'), pipeline=pipeline)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            optim_wrapper=cfg.optim_wrapper, param_scheduler=cfg.param_scheduler,
            default_hooks=cfg.default_hooks, randomness=dict(seed=0), log_level='WARNING')
        runner.train()
    assert next(theirs.parameters()).device.type == 'cpu'
    theirs.eval()
    init_default_scope('mmdet')
    return osp.join(work_dir, 'epoch_1.pth')


@pytest.fixture(scope='module')
def ours_loaded(ours, mmrotate_checkpoint):
    """`ours` with every weight and buffer set to NaN, then mmrotate's checkpoint loaded
    strictly."""
    with torch.no_grad():
        for value in ours.state_dict().values():
            if value.is_floating_point():
                value.fill_(float('nan'))
    load_checkpoint(ours, mmrotate_checkpoint, map_location='cpu', strict=True)
    return ours.eval()


def test_state_dicts_differ_only_in_neck_nesting_and_e2cnn_filter_caches(ours, theirs):
    theirs.eval()  # every e2cnn conv then holds its filter, as mmrotate saves them in eval mode
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    cached = {k for k in their_state if k.rsplit('.', 1)[-1] in CACHE_KEYS}
    renamed = {k for k in their_state if to_our_key(k) != k} - cached
    assert {k.split('.conv.')[0] for k in renamed} == {
        f'neck.{name}.{i}' for name in ('lateral_convs', 'fpn_convs') for i in range(4)}
    assert {to_our_key(k) for k in set(their_state) - cached} == set(our_state)
    for key in set(their_state) - cached:
        assert their_state[key].shape == our_state[to_our_key(key)].shape, key
    # one filter per e2cnn conv (53 in the backbone, 8 in the neck), a bias only in the neck
    assert len([k for k in cached if k.endswith('.filter')]) == 53 + 8
    assert {k.rsplit('.conv.', 1)[0] for k in cached if k.endswith('expanded_bias')} == {
        f'neck.{name}.{i}' for name in ('lateral_convs', 'fpn_convs') for i in range(4)}


def test_checkpoint_is_what_mmrotate_saves(mmrotate_checkpoint):
    # weights-only under torch >= 2.6 (redet_plugin.mm allows mmengine's objects)
    checkpoint = torch.load(mmrotate_checkpoint, map_location='cpu')
    assert {'meta', 'state_dict', 'message_hub', 'optimizer', 'param_schedulers'} <= set(checkpoint)
    assert "type='mmdet.CascadeRCNN'" in checkpoint['meta']['cfg']
    assert checkpoint['meta']['dataset_meta']['classes'][0] == 'plane'
    scalars = checkpoint['message_hub']['log_scalars']
    assert scalars and all(isinstance(v, HistoryBuffer) for v in scalars.values())
    assert 'neck.lateral_convs.0.conv.weights' in checkpoint['state_dict']
    # trained in train mode: e2cnn kept the filters of the frozen stem and stage 1 only
    filters = {k for k in checkpoint['state_dict'] if k.endswith('.filter')}
    assert filters and all(k.startswith(('backbone.conv1.', 'backbone.layer1.')) for k in filters)


def test_load_checkpoint_strict_sets_every_weight(ours_loaded, mmrotate_checkpoint):
    saved = torch.load(mmrotate_checkpoint, map_location='cpu')['state_dict']
    saved = {to_our_key(k): v for k, v in saved.items() if k.rsplit('.', 1)[-1] not in CACHE_KEYS}
    state = ours_loaded.state_dict()
    assert set(state) == set(saved)
    for key, value in state.items():
        assert torch.equal(value, saved[key]), key


def test_same_detections_as_mmrotate(ours_loaded, theirs, image):
    assert_same_detections(predict_float64(ours_loaded, image), predict_float64(theirs, image),
                           box_atol=1e-8, score_atol=1e-10)


def test_tools_test_py_runs_the_mmrotate_checkpoint(theirs, mmrotate_checkpoint, dota_folder,
                                                    image, tmp_path):
    """tools/test.py CONFIG CKPT (load_from inside) on the file mmrotate saved, no conversion."""
    from tools.test import main
    config = tmp_path / 'config.py'
    config.write_text(f"""_base_ = [{OUR_CONFIG!r}]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=({SIZE}, {SIZE}), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
test_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(
    data_root={dota_folder!r}, data_prefix=dict(img_path='images/'), pipeline=test_pipeline))
test_evaluator = dict(outfile_prefix={str(tmp_path / 'Task1')!r})
""")
    out = str(tmp_path / 'results.pkl')
    with full_fp32():  # tools/test.py runs on the GPU when there is one; both models in fp32
        main([str(config), mmrotate_checkpoint, '--work-dir', str(tmp_path / 'work'), '--out', out])
        init_default_scope('mmdet')
        try:  # mmrotate's detections on the device tools/test.py ran on
            expected = predict(theirs.to(get_device()), image)
        finally:
            theirs.cpu()
    with open(out, 'rb') as f:
        (result,) = pickle.load(f)
    found = result['pred_instances']
    assert_same_detections((found['bboxes'], found['scores'], found['labels']), expected,
                           **MODEL_TOLERANCE)


def test_imagenet_reresnet_checkpoint_loads_into_our_backbone(theirs, tmp_path):
    """ReDet's ImageNet ReResNet-50 file (re_resnet50_c8_batch256-25b16846.pth) is an mmcls
    checkpoint: the backbone under 'backbone.' with e2cnn's filter buffers, and a classifier
    'head.fc.*'. Not downloadable here, so one of that form from mmrotate's ReResNet."""
    theirs.eval()
    backbone_state = theirs.backbone.state_dict()
    assert any(k.endswith('.filter') for k in backbone_state)
    state = {f'backbone.{k}': v for k, v in backbone_state.items()}
    state.update({'head.fc.weight': torch.randn(1000, 2048), 'head.fc.bias': torch.zeros(1000)})
    path = str(tmp_path / 're_resnet50_c8_batch256.pth')
    torch.save({'meta': {'mmcls_version': '0.10.0', 'CLASSES': [f'n{i:08d}' for i in range(1000)]},
                'state_dict': state}, path)
    init_default_scope('mmdet')
    cfg = Config.fromfile(OUR_CONFIG).model.backbone
    cfg.init_cfg = dict(type='Pretrained', checkpoint=path, prefix='backbone.')
    backbone = MODELS.build(cfg)  # frozen stem: its filter is cached from the initial weights
    backbone.init_weights()
    backbone.eval()
    # every key used (e2cnn's filters dropped), nothing left over
    backbone.load_state_dict({k[len('backbone.'):]: v for k, v in state.items()
                              if k.startswith('backbone.')}, strict=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for ours, theirs_out in zip(backbone(x), theirs.backbone(x)):
            # eval BatchNorm is our one scale-shift pass against torch's batch_norm: equal on some
            # CPUs, one rounding apart on others (seen on the GPU machine's CPU)
            torch.testing.assert_close(ours, theirs_out.tensor, rtol=1e-5, atol=1e-5)


def test_refpn_extra_convs_load_both_ways():
    """mmrotate's ReFPN appends its extra convs to fpn_convs; ours keeps them in extra_convs."""
    from e2cnn.nn import GeometricTensor
    from tools.model_converters.redet_to_mmrotate import to_mmrotate_state_dict
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmrotate'):
        theirs = isolate_e2cnn_bases(MMROTATE_MODELS.build(dict(
            type='ReFPN', in_channels=[16, 32], out_channels=16, num_outs=3,
            add_extra_convs=True))).eval()
    ours = ReFPN([16, 32], 16, num_outs=3, add_extra_convs='on_input').eval()
    inputs = [torch.randn(1, 16, 16, 16), torch.randn(1, 32, 8, 8)]
    field_types = [conv.conv.in_type for conv in theirs.lateral_convs]

    def same_outputs():
        with torch.no_grad():
            expected = theirs([GeometricTensor(x, t) for x, t in zip(inputs, field_types)])
            for a, b in zip(ours(inputs), expected):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert torch.equal(ours.extra_convs[0].weights, theirs.fpn_convs[2].conv.weights)
    same_outputs()
    with torch.no_grad():  # other weights, back into mmrotate's ReFPN
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(ours.state_dict())  # refreshes e2cnn's filter caches
    theirs.load_state_dict(to_mmrotate_state_dict(ours), strict=True)
    same_outputs()


def test_converters_round_trip(tmp_path):
    """Our tiny checkpoint -> mmrotate's layout -> ours again: the same weights."""
    from tools.model_converters.mmrotate_to_redet import main as mmrotate_to_redet
    from tools.model_converters.redet_to_mmrotate import main as redet_to_mmrotate
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(TINY_CONFIG).model)
    model.init_weights()
    original = copy.deepcopy(model.state_dict())
    torch.save({'meta': {'epoch': 3}, 'state_dict': original}, tmp_path / 'ours.pth')
    redet_to_mmrotate([TINY_CONFIG, str(tmp_path / 'ours.pth'), str(tmp_path / 'mm.pth')])
    converted = torch.load(tmp_path / 'mm.pth', map_location='cpu')
    assert converted['meta']['epoch'] == 3
    keys = set(converted['state_dict'])
    assert 'neck.lateral_convs.0.conv.weights' in keys
    assert 'neck.lateral_convs.0.weights' not in keys
    assert {'backbone.layer4.1.conv2.filter', 'neck.fpn_convs.3.conv.expanded_bias'} <= keys
    mmrotate_to_redet([TINY_CONFIG, str(tmp_path / 'mm.pth'), str(tmp_path / 'back.pth')])
    back = torch.load(tmp_path / 'back.pth', map_location='cpu')['state_dict']
    assert set(back) == set(original)
    for key, value in original.items():
        assert torch.equal(back[key], value), key


@pytest.mark.parametrize('change', ['none', 'tie_swapped', 'box', 'score', 'label', 'duplicate',
                                    'missing'])
def test_detection_comparison_ignores_only_the_order(change):
    g = torch.Generator().manual_seed(0)
    n = 40
    boxes = torch.rand(n, 5, generator=g) * 100
    scores = torch.rand(n, generator=g).sort(descending=True).values
    labels = torch.randint(0, 15, (n,), generator=g)
    scores[11] = scores[10]
    labels[10], labels[11] = 13, 5  # equal scores, different classes
    theirs = [boxes + 5e-5, scores - 5e-7, labels.clone()]  # within the tolerances
    if change == 'tie_swapped':
        order = torch.arange(n)
        order[[10, 11]] = order[[11, 10]]
        theirs = [t[order] for t in theirs]
    elif change == 'box':
        theirs[0][7, 2] += 1e-4
    elif change == 'score':
        theirs[1][7] += 2e-6
    elif change == 'label':
        theirs[2][7] = (labels[7] + 1) % 15
    elif change == 'duplicate':  # their detection 7 twice, 8 not at all
        theirs = [t.clone() for t in theirs]
        for t in theirs:
            t[8] = t[7]
    elif change == 'missing':
        theirs = [t[:-1] for t in theirs]
    if change in ('none', 'tie_swapped'):
        assert_same_detections((boxes, scores, labels), tuple(theirs))
    else:
        with pytest.raises(AssertionError):
            assert_same_detections((boxes, scores, labels), tuple(theirs))


def test_converter_names_a_missing_checkpoint(tmp_path):
    from tools.model_converters.mmrotate_to_redet import main
    with pytest.raises(SystemExit, match='no_such.pth'):
        main([TINY_CONFIG, str(tmp_path / 'no_such.pth'), str(tmp_path / 'out.pth')])


@pytest.mark.cuda
def test_same_detections_as_mmrotate_with_mmcv_kernel_on_gpu(mmrotate_checkpoint, image):
    """mmrotate's model with mmcv's own RiRoIAlignRotated (CUDA) vs ours, both new and loaded
    strictly from mmrotate's checkpoint (no deepcopy: e2cnn's eval-mode filters hold graphs)."""
    # in train mode, as the Runner saved it: e2cnn's filters are then kept by the frozen stem only
    theirs = build_mmrotate_redet(mmcv_kernel=True).train()
    load_checkpoint(theirs, mmrotate_checkpoint, map_location='cpu', strict=True)
    init_default_scope('mmdet')
    ours = MODELS.build(Config.fromfile(OUR_CONFIG).model)
    load_checkpoint(ours, mmrotate_checkpoint, map_location='cpu', strict=True)
    with full_fp32():
        ours_found = predict(ours.cuda().eval(), image)
        theirs_found = predict(theirs.cuda().eval(), image)
    assert_same_detections(ours_found, theirs_found, **MODEL_TOLERANCE)
