"""The drop-in mmrotate config configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py: it is
mmrotate's own ReDet config with only the second stage's RoI extractor swapped for ours, and that
extractor pools the same features as mmrotate's (legacy_orientation = mmcv's kernel). The feature
comparison needs CUDA (mmcv's RiRoIAlignRotated has no CPU kernel)."""
import copy
import math
from pathlib import Path

import pytest
import torch

from tests._helpers import register_mmrotate

register_mmrotate()

CONFIG = str(Path(__file__).resolve().parents[2] /
             'configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py')
PEER = 'mmrotate::redet/redet-le90_re50_refpn_1x_dota.py'


def _configs():
    from mmengine.config import Config
    from mmengine.hub import get_config
    return Config.fromfile(CONFIG).to_dict(), get_config(PEER).to_dict()


def _without_scope(node):
    if isinstance(node, dict):
        return {k: _without_scope(v) for k, v in node.items() if k != '_scope_'}
    if isinstance(node, (list, tuple)):
        return type(node)(_without_scope(v) for v in node)
    return node


def test_only_custom_imports_and_the_rotated_extractor_differ():
    ours, peer = _configs()
    assert ours.pop('custom_imports') == dict(imports=['redet_plugin.mm'],
                                              allow_failed_imports=False)
    ours_extractor = ours['model']['roi_head']['bbox_roi_extractor'].pop(1)
    peer_extractor = peer['model']['roi_head']['bbox_roi_extractor'].pop(1)
    assert _without_scope(ours) == _without_scope(peer)
    assert ours_extractor['type'] == 'mmdet.RedetRotatedSingleRoIExtractor'
    layer = dict(ours_extractor['roi_layer'])
    assert layer.pop('type') == 'RedetRiRoIAlignRotated'
    assert layer.pop('legacy_orientation') is True
    peer_layer = dict(peer_extractor['roi_layer'])
    peer_layer.pop('type')
    peer_layer['output_size'] = peer_layer.pop('out_size')
    assert layer == peer_layer
    for key in ('out_channels', 'featmap_strides'):
        assert ours_extractor[key] == peer_extractor[key]


def _extractor(model_cfg):
    from mmengine.registry import DefaultScope
    from mmrotate.registry import MODELS
    cfg = copy.deepcopy(model_cfg['roi_head']['bbox_roi_extractor'][1])
    with DefaultScope.overwrite_default_scope('mmrotate'):
        return MODELS.build(cfg).cuda()


@pytest.mark.cuda
def test_swapped_extractor_pools_what_mmrotates_pools():
    ours_cfg, peer_cfg = _configs()
    ours, peer = _extractor(ours_cfg['model']), _extractor(peer_cfg['model'])
    assert type(ours).__module__.startswith('redet_plugin')
    g = torch.Generator(device='cuda').manual_seed(0)
    feats = [torch.randn(2, 256, 256 // s, 256 // s, device='cuda', generator=g)
             for s in (4, 8, 16, 32)]
    n = 300
    size = torch.exp(torch.empty(n, device='cuda').uniform_(math.log(8), math.log(250),
                                                             generator=g))
    centres = torch.rand(n, 2, device='cuda', generator=g) * 256
    rois = torch.stack([
        (torch.arange(n, device='cuda') % 2).float(), centres[:, 0], centres[:, 1],
        size, size * torch.empty(n, device='cuda').uniform_(0.3, 1.0, generator=g),
        (torch.rand(n, device='cuda', generator=g) * 2 - 1) * math.pi], dim=1)
    expected = peer(feats, rois)
    got = ours(feats, rois)
    assert got.shape == expected.shape == (n, 256, 7, 7)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
