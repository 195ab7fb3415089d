"""`python tests/test_tools/_train_process.py ARGS...` runs `python tools/train.py ARGS...` in this
process, for the tests that kill a training (tests/test_tools/test_resume.py), with two changes
read from the environment (by this helper only):
- REDET_TEST_FLUSH_DENORMAL=1: one CPU thread, with denormal floats flushed to zero (a setting
  of the calling thread only, hence the one thread), as one setting of every run of a test: the
  tiny model's steps take ~0.3 s instead of up to 5 s once its values get tiny, and two runs
  with the same setting stay comparable;
- REDET_TEST_SLOW_WRITE=<file name>:<n>:<seconds>: the n-th atomic write of that file (a
  checkpoint or last_checkpoint) stops half-way for that long, its first half on disk in the
  temporary file, after making the file `slow_write_started` next to it: the test kills the
  process then, in the middle of the write.
"""
import os
import os.path as osp
import runpy
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _slow_writes(name: str, nth: int, seconds: float) -> None:
    real_fdopen = os.fdopen
    writes = [0]

    class HalfThenWait:
        def __init__(self, f, path):
            self._f, self._path = f, path

        def write(self, data):
            half = len(data) // 2
            self._f.write(data[:half])
            self._f.flush()
            os.fsync(self._f.fileno())
            open(osp.join(osp.dirname(self._path), 'slow_write_started'), 'w').close()
            time.sleep(seconds)
            return half + self._f.write(data[half:])

        def __getattr__(self, attr):
            return getattr(self._f, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        path = os.readlink(f'/proc/self/fd/{fd}')
        if osp.basename(path).startswith(f'.{name}.') and path.endswith('.part'):
            writes[0] += 1
            if writes[0] == nth:
                return HalfThenWait(f, path)
        return f

    os.fdopen = fdopen


if __name__ == '__main__':
    if os.environ.get('REDET_TEST_FLUSH_DENORMAL') == '1':
        import torch
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
    slow = os.environ.get('REDET_TEST_SLOW_WRITE')
    if slow:
        name, nth, seconds = slow.rsplit(':', 2)
        _slow_writes(name, int(nth), float(seconds))
    sys.argv = [osp.join(ROOT, 'tools', 'train.py'), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name='__main__')
