"""Checkpoints and last_checkpoint are written whole or not at all: a run killed while writing
leaves the previous file under the name (redet_plugin/engine/atomic_local_backend.py)."""
import os
from unittest import mock

import pytest
import torch
from mmengine.config import Config
from mmengine.fileio import get_file_backend
from mmengine.runner.checkpoint import save_checkpoint

import redet_plugin.mm  # noqa: F401
from redet_plugin.engine import AtomicLocalBackend, atomic_write

RUNTIME = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', '_base_',
                       'default_runtime.py')


def test_the_configs_checkpoint_hook_writes_through_the_atomic_backend(tmp_path):
    backend_args = Config.fromfile(RUNTIME).default_hooks.checkpoint.backend_args
    assert isinstance(get_file_backend(str(tmp_path), backend_args=backend_args),
                      AtomicLocalBackend)


def test_a_write_cut_short_leaves_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / 'epoch_1.pth')
    backend_args = dict(backend='redet_atomic_local')
    save_checkpoint({'state_dict': {'w': torch.zeros(3)}}, path, backend_args=backend_args)
    # the process dies while the new bytes go to disk
    with mock.patch('os.fsync', side_effect=KeyboardInterrupt), pytest.raises(KeyboardInterrupt):
        save_checkpoint({'state_dict': {'w': torch.ones(3)}}, path, backend_args=backend_args)
    assert torch.equal(torch.load(path)['state_dict']['w'], torch.zeros(3))
    assert os.listdir(tmp_path) == ['epoch_1.pth']  # no temporary file left behind
    save_checkpoint({'state_dict': {'w': torch.ones(3)}}, path, backend_args=backend_args)
    assert torch.equal(torch.load(path)['state_dict']['w'], torch.ones(3))


def test_text_is_replaced_whole(tmp_path):
    path = tmp_path / 'sub' / 'last_checkpoint'
    AtomicLocalBackend().put_text('a/epoch_1.pth', path)
    atomic_write(b'a/epoch_2.pth', path)
    assert path.read_text() == 'a/epoch_2.pth'
