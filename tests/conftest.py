"""Test-session setup shared by every test folder."""
import os

# On a machine with several GPUs, REDET_TEST_GPUS=N gives pytest-xdist worker k the GPU k mod N
# (its subprocesses inherit it). Set before any test touches CUDA: torch reads the variable when
# it first initialises CUDA, not on import.
_gpus = int(os.environ.get('REDET_TEST_GPUS', '0') or 0)
_worker = os.environ.get('PYTEST_XDIST_WORKER', '')  # 'gw0', 'gw1', ... under xdist
if _gpus > 1 and _worker.startswith('gw'):
    os.environ['CUDA_VISIBLE_DEVICES'] = str(int(_worker[2:]) % _gpus)
