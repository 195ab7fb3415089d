"""The tools import the OpenMMLab stack without transformers unless the config needs it; each case
in a fresh process, with a stand-in transformers package that leaves a mark when imported."""
import os
import os.path as osp
import subprocess
import sys

import pytest

from redet_plugin.utils.transformers_hidden import needs_transformers

from tests._helpers import REPO

TINY = osp.join(REPO, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')


@pytest.fixture
def stand_in(tmp_path):
    """(environment, mark path): a transformers package that writes the mark, then is absent."""
    package = tmp_path / 'site' / 'transformers'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(
        'import os\nopen(os.environ["TRANSFORMERS_MARK"], "w").close()\n'
        'raise ImportError("stand-in")\n')
    mark = tmp_path / 'imported'
    env = dict(os.environ, TRANSFORMERS_MARK=str(mark),
               PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path / 'site'), REPO,
                                                      os.environ.get('PYTHONPATH')) if p))
    return env, mark


def run_help(tool, args, env):
    done = subprocess.run([sys.executable, tool, *args, '--help'], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize('tool', ['tools/train.py', 'tools/test.py', 'tools/infer.py',
                                  'tools/export.py'])
def test_a_tool_imports_the_stack_without_transformers(tool, stand_in):
    env, mark = stand_in
    run_help(tool, [TINY], env)
    assert not mark.exists()


def test_a_config_option_that_needs_transformers_imports_it(stand_in):
    env, mark = stand_in
    run_help('tools/train.py', [TINY, '--cfg-options', 'optim_wrapper.optimizer.type=Adafactor'], env)
    assert mark.exists()


def test_transformers_imports_as_usual_after_the_stack(stand_in):
    env, mark = stand_in
    code = ('from redet_plugin.utils.transformers_hidden import transformers_hidden\n'
            'with transformers_hidden([]):\n'
            '    import mmengine.optim\n'
            '    try:\n'
            '        import transformers\n'
            '    except ModuleNotFoundError as e:\n'
            '        assert "hidden while the tool imports" in str(e), e\n'
            'import os\n'
            'assert not os.path.exists(os.environ["TRANSFORMERS_MARK"])\n'
            'try:\n'
            '    import transformers\n'
            'except ImportError as e:\n'
            '    assert str(e) == "stand-in", e\n')
    done = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert mark.exists()


def test_needs_transformers_reads_the_config_and_the_options(tmp_path):
    assert not needs_transformers([TINY, '--work-dir', 'w'])
    assert needs_transformers([TINY, '--cfg-options', 'optim_wrapper.optimizer.type=Adafactor'])
    grounding = tmp_path / 'grounding.py'
    grounding.write_text(f"_base_ = [{TINY!r}]\nlanguage_model = dict(type='BertModel')\n")
    assert needs_transformers([str(grounding)])
    broken = tmp_path / 'broken.py'
    broken.write_text('model = dict(\n')
    assert needs_transformers([str(broken)])
