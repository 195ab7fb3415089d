"""Every component is reachable by name from mmdet's MODELS, builds from a config dict and runs
forward + backward on the CPU; names do not clash with mmdet's; importing twice is harmless."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from mmcv import ops as mmcv_ops
from mmdet.registry import MODELS
from mmengine.registry import MODELS as ROOT_MODELS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin import ops as redet_ops
from redet_plugin.models.roi_heads.roi_extractors.roi_layer_builder import resolve_roi_layer_class

REPO = Path(__file__).resolve().parents[2]
OUR_NAMES = ["RedetRoIPool", "RedetRiRoIAlignRotated", "RedetDepthFlowProjection",
             "RedetRotatedSingleRoIExtractor", "RedetHorizontalSingleRoIExtractor",
             "RedetRoIPoolRoIHead", "RedetReResNet", "RedetReFPN", "RedetReDet"]


def _registered(name):
    return name in MODELS.module_dict


@pytest.mark.parametrize("name", OUR_NAMES)
def test_our_names_are_registered_in_mmdet_and_clash_with_nothing_upstream(name):
    assert _registered(name)
    assert MODELS.get(name).__module__.startswith("redet_plugin.")
    assert name not in ROOT_MODELS.module_dict  # mmengine / mmcv have no such name either


def test_every_component_follows_the_one_naming_scheme():
    from mmdet import registry as mmdet_registry
    registries = [getattr(mmdet_registry, n) for n in
                  ("MODELS", "DATASETS", "TRANSFORMS", "METRICS", "TASK_UTILS", "VISUALIZERS",
                   "HOOKS")]
    ours = {(reg.name, name): cls for reg in registries for name, cls in reg.module_dict.items()
            if cls.__module__.startswith("redet_plugin.")}
    assert len(ours) >= 20
    for (registry, name), cls in ours.items():
        assert name == "Redet" + cls.__name__, (registry, name)


def test_roi_layer_names_resolve_to_ours_first_then_to_mmcv():
    assert resolve_roi_layer_class("RedetRoIPool") is redet_ops.RoIPool
    assert resolve_roi_layer_class("mmdet.RedetRoIPool") is redet_ops.RoIPool
    assert resolve_roi_layer_class("RoIPool") is mmcv_ops.RoIPool  # mmcv's name stays mmcv's
    assert resolve_roi_layer_class("RoIAlign") is mmcv_ops.RoIAlign
    assert resolve_roi_layer_class(mmcv_ops.RoIPool) is mmcv_ops.RoIPool
    with pytest.raises(KeyError, match="'NoSuchLayer' is neither a module registered"):
        resolve_roi_layer_class("NoSuchLayer")
    with pytest.raises(TypeError, match="type must be a class or a name, got 3"):
        resolve_roi_layer_class(3)


def _backward_reaches(inputs, output):
    output.square().sum().backward()
    return [x.grad is not None and bool(x.grad.abs().sum() > 0) for x in inputs]


def test_roipool_layer_builds_and_trains():
    layer = MODELS.build(dict(type="RedetRoIPool", output_size=(3, 4), spatial_scale=0.5))
    x = torch.randn(2, 3, 10, 12, requires_grad=True)
    rois = torch.tensor([[0, 1.0, 2.0, 15.0, 12.0], [1, 0.0, 0.0, 23.0, 19.0]])
    out = layer(x, rois)
    assert out.shape == (2, 3, 3, 4)
    assert _backward_reaches([x], out) == [True]


def test_riroi_layer_builds_and_trains():
    layer = MODELS.build(dict(type="RedetRiRoIAlignRotated", output_size=7, spatial_scale=0.25,
                              num_samples=2, num_orientations=8, clockwise=True))
    assert type(layer) is redet_ops.RiRoIAlignRotated
    x = torch.randn(2, 16, 20, 20, requires_grad=True)
    rois = torch.tensor([[0, 40.0, 40.0, 30.0, 20.0, 0.3], [1, 30.0, 50.0, 16.0, 40.0, -1.2]])
    out = layer(x, rois)
    assert out.shape == (2, 16, 7, 7)
    assert _backward_reaches([x], out) == [True]


def test_depth_flow_projection_builds_and_trains():
    layer = MODELS.build(dict(type="RedetDepthFlowProjection", t=0.5, fill_holes=False))
    assert type(layer) is redet_ops.DepthFlowProjection
    flow = torch.randn(1, 2, 6, 7, requires_grad=True)
    depth = (torch.rand(1, 1, 6, 7) + 0.5).requires_grad_(True)
    out = layer(flow, depth)
    assert out.shape == (1, 2, 6, 7)
    assert _backward_reaches([flow, depth], out) == [True, True]


def _pyramid(channels, sizes=(32, 16, 8, 4)):
    return [torch.randn(2, channels, s, s, requires_grad=True) for s in sizes]


@pytest.mark.parametrize("roi_layer", [dict(type="RedetRoIPool", output_size=7),
                                       dict(type="RoIAlign", output_size=7, sampling_ratio=2)])
def test_horizontal_extractor_builds_with_our_and_mmcv_layers(roi_layer):
    extractor = MODELS.build(dict(type="RedetHorizontalSingleRoIExtractor", roi_layer=roi_layer,
                                  out_channels=4, featmap_strides=[4, 8, 16, 32]))
    expected = redet_ops.RoIPool if roi_layer["type"] == "RedetRoIPool" else mmcv_ops.RoIAlign
    assert all(type(layer) is expected for layer in extractor.roi_layers)
    feats = _pyramid(4)
    rois = torch.tensor([[0, 4.0, 4.0, 40.0, 40.0], [1, 10.0, 0.0, 150.0, 120.0],
                         [1, 0.0, 0.0, 250.0, 250.0]])  # levels 0, 1, 2
    out = extractor(feats, rois)
    assert out.shape == (3, 4, 7, 7)
    assert _backward_reaches(feats, out) == [True, True, True, False]


def test_rotated_extractor_builds_with_an_mmcv_layer():
    extractor = MODELS.build(dict(
        type="RedetRotatedSingleRoIExtractor", out_channels=4, featmap_strides=[4, 8, 16, 32],
        roi_layer=dict(type="RoIAlignRotated", output_size=5, sampling_ratio=2, clockwise=True)))
    assert all(type(layer) is mmcv_ops.RoIAlignRotated for layer in extractor.roi_layers)
    assert extractor.fused is False  # mmcv's layer has no multi-level kernel
    feats = _pyramid(4)
    rois = torch.tensor([[0, 30.0, 30.0, 40.0, 20.0, 0.5], [1, 64.0, 64.0, 150.0, 100.0, -0.3]])
    out = extractor(feats, rois)
    assert out.shape == (2, 4, 5, 5)
    assert _backward_reaches(feats, out) == [True, True, False, False]


@pytest.mark.parametrize("fused", [True, False])
def test_rotated_extractor_builds_with_our_riroi_layer(fused):
    extractor = MODELS.build(dict(
        type="RedetRotatedSingleRoIExtractor", out_channels=16, featmap_strides=[4, 8, 16, 32],
        fused=fused, roi_layer=dict(type="RedetRiRoIAlignRotated", output_size=7, num_samples=2,
                                    num_orientations=8, clockwise=True)))
    assert all(type(layer) is redet_ops.RiRoIAlignRotated for layer in extractor.roi_layers)
    assert extractor.fused is fused
    feats = _pyramid(16)
    rois = torch.tensor([[0, 30.0, 30.0, 40.0, 20.0, 0.5], [1, 64.0, 64.0, 150.0, 100.0, -0.3]])
    out = extractor(feats, rois)
    assert out.shape == (2, 16, 7, 7)
    assert _backward_reaches(feats, out)[:2] == [True, True]


def test_roipool_roi_head_builds_with_its_preset():
    head = MODELS.build(dict(type="RedetRoIPoolRoIHead", num_classes=3, in_channels=8,
                             fc_out_channels=16, bbox_head=dict(reg_class_agnostic=True)))
    assert all(type(layer) is redet_ops.RoIPool for layer in head.bbox_roi_extractor.roi_layers)
    assert head.bbox_head.num_classes == 3 and head.bbox_head.reg_class_agnostic
    feats = _pyramid(8)
    rois = torch.tensor([[0, 4.0, 4.0, 40.0, 40.0], [1, 10.0, 0.0, 120.0, 100.0]])
    results = head._bbox_forward(feats, rois)
    assert results["cls_score"].shape == (2, 4) and results["bbox_pred"].shape == (2, 4)
    (results["cls_score"].sum() + results["bbox_pred"].sum()).backward()
    assert all(p.grad is not None for p in head.bbox_head.parameters())
    assert feats[0].grad.abs().sum() > 0


def test_importing_twice_and_reloading_is_harmless():
    script = textwrap.dedent("""
        import importlib, sys
        import redet_plugin.mm
        import redet_plugin.mm as again
        from mmdet.registry import MODELS
        before = {n: MODELS.get(n) for n in %r if MODELS.get(n) is not None}
        # the mm layer's entry, the package import lists and registering modules
        names = ['redet_plugin.models.layers.op_modules',
                 'redet_plugin.models.roi_heads.roi_extractors.rotated_single_level_roi_extractor',
                 'redet_plugin.models.roi_heads.roi_extractors.horizontal_single_level_roi_extractor',
                 'redet_plugin.models.roi_heads.roipool_roi_head', 'redet_plugin.models',
                 'redet_plugin.datasets.dota', 'redet_plugin.evaluation.dota_metric',
                 'redet_plugin.mm']
        modules = [sys.modules[name] for name in names]
        for module in modules:
            importlib.reload(module)
        after = {n: MODELS.get(n) for n in before}
        assert all(after[n].__qualname__ == before[n].__qualname__ for n in before), after
        MODELS.build(dict(type='RedetHorizontalSingleRoIExtractor', out_channels=4, featmap_strides=[4],
                          roi_layer=dict(type='RedetRoIPool', output_size=7)))
        # a genuine clash (another class under a taken name) is still refused
        from redet_plugin.utils.registration import register
        try:
            register(MODELS)(type('RoIPoolRoIHead', (), {}))
        except KeyError as error:
            print('clash refused:', error)
        print('reloaded', len(modules), 'modules;', len(before), 'names')
    """ % (OUR_NAMES,))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clash refused:" in result.stdout and "RedetRoIPoolRoIHead" in result.stdout
    assert "reloaded" in result.stdout


def test_mmdets_own_extractor_takes_our_roipool_given_as_a_class():
    """The other way in (a pure-Python config that imports the class): mmdet's SingleRoIExtractor
    uses a non-string roi_layer type as is."""
    extractor = MODELS.build(dict(type="SingleRoIExtractor", out_channels=4, featmap_strides=[4, 8],
                                  roi_layer=dict(type=redet_ops.RoIPool, output_size=7)))
    assert all(type(layer) is redet_ops.RoIPool for layer in extractor.roi_layers)
    feats = _pyramid(4, sizes=(32, 16))
    out = extractor(feats, torch.tensor([[0, 4.0, 4.0, 40.0, 40.0]]))
    assert _backward_reaches(feats, out) == [True, False]
