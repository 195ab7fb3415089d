"""tests/conftest.py ends an xdist worker stuck after its last test, with its threads' stacks."""
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest

from tests._helpers import REPO

pytest.importorskip('xdist')

CONFTEST = osp.join(REPO, 'tests', 'conftest.py')
STUCK = '''
import time
import pytest

@pytest.fixture(scope='session')
def stuck_teardown():
    yield
    time.sleep(1000)

def test_uses_it(stuck_teardown):
    pass

def test_other():
    pass
'''


def _run_suite(folder, source):
    shutil.copy(CONFTEST, folder / 'conftest.py')
    (folder / 'test_suite.py').write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTEST_')}
    env.update(REDET_TEST_EXIT_S='3', REDET_TEST_HANG_DIR=str(folder / 'stacks'))
    return subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '1', '-p', 'no:cacheprovider',
                           'test_suite.py'], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=150)


def test_a_worker_stuck_in_a_teardown_ends_and_leaves_its_stacks(tmp_path):
    run = _run_suite(tmp_path, STUCK)
    assert run.returncode != 0
    assert 'crashed while running' in run.stdout, run.stdout[-2000:]
    stacks = (tmp_path / 'stacks' / 'gw0_exit_stacks.txt').read_text()
    assert 'in stuck_teardown' in stacks


def test_a_worker_that_ends_leaves_no_file(tmp_path):
    run = _run_suite(tmp_path, 'def test_fine():\n    pass\n')
    assert run.returncode == 0, run.stdout[-2000:]
    assert os.listdir(tmp_path / 'stacks') == []
