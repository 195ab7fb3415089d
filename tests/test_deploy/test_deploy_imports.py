"""redet_plugin.deploy runs a package with torch and redet_plugin.ops only: in a fresh process,
importing it, loading a package and running it loads none of the training stack."""
import json
import os
import subprocess
import sys

import pytest

from tests._helpers import REPO

from .conftest import IMAGE_SIZE

TRAINING_STACK = ('mmengine', 'mmdet', 'mmcv', 'e2cnn')

PROBE = '''
import json, sys
import torch
import redet_plugin.deploy
stages = {{'import': sorted(sys.modules)}}
detector = redet_plugin.deploy.load({path!r})
stages['load'] = sorted(sys.modules)
found = detector(torch.full(({height}, {width}, 3), 100, dtype=torch.uint8))
stages['run'] = sorted(sys.modules)
print(json.dumps(dict(stages=stages, detections=len(found), names=found.class_names[:1])))
'''


def test_fresh_process_loads_no_training_stack(program_package):
    code = PROBE.format(path=program_package, height=IMAGE_SIZE[0], width=IMAGE_SIZE[1])
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(program_package), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report['detections'] >= 0 and isinstance(report['names'], list)
    for stage, modules in report['stages'].items():
        loaded = sorted({m.split('.')[0] for m in modules} & set(TRAINING_STACK))
        assert not loaded, f'after {stage}: {loaded} imported'
    assert 'redet_plugin.ops' in report['stages']['import']


# the modules of another part that deploy/ uses: capturing a CUDA graph so that a failed capture
# leaves torch's generator working; TF32 for the matrix products of a block
TORCH_ONLY_HELPERS = ('redet_plugin.utils.cuda_capture', 'redet_plugin.utils.precision')


def test_deploy_source_imports_torch_and_ops_only():
    from tests.test_package_layers import _offenders
    offenders = [found for found in _offenders('deploy', {'ops'}, allowed_libraries={'torch'})
                 if not found.split(': ')[1].startswith(TORCH_ONLY_HELPERS)]
    assert not offenders, f'deploy/ imports more than torch and redet_plugin.ops: {offenders}'


@pytest.mark.parametrize('helper', TORCH_ONLY_HELPERS)
def test_deploys_helpers_import_torch_only(helper):
    from tests.test_package_layers import PACKAGE_DIR, imported_modules
    path = PACKAGE_DIR.parent.joinpath(*helper.split('.')).with_suffix('.py')
    libraries = {name.split('.')[0] for name in imported_modules(path)}
    assert libraries <= {'torch'} | set(sys.stdlib_module_names), sorted(libraries)
