"""Test-session setup shared by every test folder."""
import faulthandler
import os
import random
import tempfile
import zlib

import pytest

# On a machine with several GPUs, REDET_TEST_GPUS=N gives pytest-xdist worker k the GPU k mod N
# (its subprocesses inherit it). Set before any test touches CUDA: torch reads the variable when
# it first initialises CUDA, not on import.
_gpus = int(os.environ.get('REDET_TEST_GPUS', '0') or 0)
_worker = os.environ.get('PYTEST_XDIST_WORKER', '')  # 'gw0', 'gw1', ... under xdist
if _gpus > 1 and _worker.startswith('gw'):
    os.environ['CUDA_VISIBLE_DEVICES'] = str(int(_worker[2:]) % _gpus)

# Under pytest-xdist each worker's torch would start one thread per core, so n workers put n times
# as many busy threads as there are cores, and every worker slows down. Each worker gets its share
# of the cores instead; subprocesses (the tools' tests) inherit it through OMP_NUM_THREADS. A value
# set by the user is kept.
_workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0') or 0)
if _workers > 1:
    _share = str(max(1, (os.cpu_count() or 1) // _workers))
    os.environ.setdefault('OMP_NUM_THREADS', _share)
    os.environ.setdefault('MKL_NUM_THREADS', os.environ['OMP_NUM_THREADS'])

# numpy and torch read the thread settings above when they are imported.
import numpy  # noqa: E402
import torch  # noqa: E402

if _workers > 1:
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


@pytest.fixture(autouse=True)
def _seed_each_test(request):
    """Each test starts from its own fixed seed, so its random inputs do not depend on which tests
    ran before it in the same process (xdist spreads them differently on every run)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


_exit_stacks = []  # the open file a stuck worker's stacks go to (faulthandler writes to its fd)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """An xdist worker that has run its tests but does not end (a fixture's teardown or a thread
    that waits forever) would keep the whole run waiting until its time limit. From the teardown
    of its last test (where session fixtures end too) on, it has REDET_TEST_EXIT_S seconds
    (default 120); then it writes every thread's stack to <REDET_TEST_HANG_DIR, else the temp
    folder>/<worker>_exit_stacks.txt and exits, and xdist reports the test it was tearing down
    as crashed. (Its stderr is pytest's capture at that point, which nobody reads.)"""
    if not _worker or nextitem is not None:
        return
    folder = os.environ.get('REDET_TEST_HANG_DIR') or tempfile.gettempdir()
    os.makedirs(folder, exist_ok=True)
    _exit_stacks.append(open(os.path.join(folder, f'{_worker}_exit_stacks.txt'), 'w'))
    faulthandler.dump_traceback_later(float(os.environ.get('REDET_TEST_EXIT_S', '120')),
                                      exit=True, file=_exit_stacks[-1])


def pytest_unconfigure(config):
    for stacks in _exit_stacks:  # the worker got this far: nothing to report
        faulthandler.cancel_dump_traceback_later()
        stacks.close()
        os.remove(stacks.name)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` run first, so that with several workers (pytest -n) the longest ones
    start at once instead of ending the run alone. Tests marked `cuda` (also a parametrize case:
    pytest.param(..., marks=pytest.mark.cuda)) skip where torch sees no CUDA device."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # (a stable sort)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
