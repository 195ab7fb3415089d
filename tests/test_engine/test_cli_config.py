"""The tools' config loading (redet_plugin/engine/cli.py load_config)."""
import os.path as osp
from types import SimpleNamespace

import mmengine.config.config as mmengine_config
from mmengine.config import Config

from redet_plugin.engine.cli import load_config
from tests._helpers import REPO

R50 = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py')


def _args(**options):
    return SimpleNamespace(config=R50, cfg_options=options, launcher='none', work_dir=None)


def test_config_text_is_written_without_yapf_and_loads_back_the_same(tmp_path, monkeypatch):
    cfg = load_config(_args(**{'model.test_cfg.rcnn.max_per_img': 123}))

    def no_yapf(*args, **kwargs):
        raise AssertionError('yapf formatted the config text')

    monkeypatch.setattr(mmengine_config, 'FormatCode', no_yapf)
    dumped = tmp_path / 'dumped.py'
    cfg.dump(str(dumped))  # what the Runner writes to the work dir (and puts in checkpoints)
    monkeypatch.undo()
    reloaded = Config.fromfile(str(dumped))
    assert reloaded.to_dict() == cfg.to_dict()
    assert reloaded.model.test_cfg.rcnn.max_per_img == 123

