"""The configs' names before the mmdet 3.x naming still load, as the same configs."""
import os.path as osp

import pytest
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RENAMED = {
    'configs/_base_/models/redet_re50_refpn.py': 'configs/_base_/models/redet-le90_re50_refpn.py',
    'configs/redet/redet_re50_refpn_1x_dota.py': 'configs/redet/redet-le90_re50_refpn_1x_dota.py',
    'configs/redet/redet_re50_refpn_roialign_1x_dota.py':
        'configs/redet/redet-le90_re50_refpn_roialign_1x_dota.py',
    'configs/redet/redet_re50_refpn_mmrotate_1x_dota.py':
        'configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py',
    'configs/redet/redet_re50_refpn_synthetic1024.py':
        'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py',
    'configs/redet/redet_re18_refpn_tiny_synthetic.py':
        'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py',
}
# keys that name the file rather than configure anything
FILE_KEYS = ('filename', 'text', 'pretty_text', 'env_variables')


def resolved(path):
    cfg = Config.fromfile(osp.join(ROOT, path)).to_dict()
    return {k: v for k, v in cfg.items() if k not in FILE_KEYS}


@pytest.mark.parametrize('old, new', RENAMED.items(), ids=lambda p: osp.basename(p))
def test_old_name_is_the_new_config(old, new):
    with open(osp.join(ROOT, old)) as f:
        assert f.read() == (f"# deprecated name; use {new}\n"
                            f"_base_ = './{osp.basename(new)}'\n")
    assert resolved(old) == resolved(new)
