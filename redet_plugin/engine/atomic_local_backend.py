"""A local file backend whose writes are atomic, for checkpoints that survive a kill.

mmengine's LocalBackend opens the final path and writes into it: a run killed while a checkpoint
is written leaves a truncated file under the checkpoint's name, and `last_checkpoint` may then
name it, so `--resume` fails on it. Here every write goes to a temporary file in the same folder,
is flushed to disk, and is renamed onto the final name (os.replace is atomic on one file system):
a reader sees the old file or the whole new one, never a part.

The configs name it in the checkpoint hook: `default_hooks.checkpoint.backend_args =
dict(backend='redet_atomic_local')`; the checkpoint hook then saves checkpoints through it.
(mmengine's CheckpointHook writes `last_checkpoint` with a plain open(): RedetCheckpointHook,
checkpoint_hook.py, writes it with atomic_write.) A kill leaves the temporary file of the cut
write behind; remove_partial_writes clears them (tools/train.py, before a resumed run).
"""
import glob
import os
import os.path as osp
import re
import tempfile
from pathlib import Path
from typing import List, Union

from mmengine.fileio import LocalBackend, register_backend

BACKEND_NAME = 'redet_atomic_local'
_PART = re.compile(r'^\..+\.[a-z0-9_]{8}\.part$')  # the temporary names atomic_write gives


def atomic_write(data: bytes, filepath: Union[str, Path]) -> None:
    """Writes `data` to `filepath` through a temporary file renamed onto it."""
    folder = osp.dirname(osp.abspath(filepath))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f'.{osp.basename(filepath)}.', suffix='.part')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def remove_partial_writes(folder: str) -> List[str]:
    """Removes the temporary files that writes cut short (a killed run) left in `folder`; returns
    their paths. Call it where no write is under way (tools/train.py: before a resumed run)."""
    removed = []
    for path in glob.glob(osp.join(glob.escape(folder), '.*.part')):
        if _PART.match(osp.basename(path)) and osp.isfile(path):
            os.remove(path)
            removed.append(path)
    return removed


class AtomicLocalBackend(LocalBackend):
    """LocalBackend whose put and put_text replace the file whole (atomic_write)."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(obj.encode(encoding), filepath)


register_backend(BACKEND_NAME, AtomicLocalBackend, force=True)
