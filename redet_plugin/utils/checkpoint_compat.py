"""Lets mmengine checkpoints load under torch >= 2.6, whose torch.load defaults to weights_only=True.

mmengine 0.10.7 saves its message hub (HistoryBuffer objects holding numpy arrays and scalars) in
every checkpoint, and loads with plain torch.load; the weights-only unpickler refuses those
classes, so `resume` and `load_from` fail. We allow exactly the objects such checkpoints hold.

`getattr` is among them: pickle protocol 2 stores HistoryBuffer's statistics functions
(HistoryBuffer.min, ...) as getattr(HistoryBuffer, 'min'). The weights-only unpickler still refuses
to call anything that is not allowlisted, so getattr can look attributes up but not run them.
"""
import builtins

import numpy as np
import torch


def _numpy_globals():
    core = getattr(np, "_core", None) or np.core
    found = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar]
    # dtype classes (numpy >= 1.25 pickles dtypes by their class, e.g. numpy.dtypes.Float64DType)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")]
    found += [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
              np.uint8, np.bool_]
    return found


def register_checkpoint_safe_globals() -> None:
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 loads everything anyway
        return
    from mmengine.logging.history_buffer import HistoryBuffer
    add([HistoryBuffer, builtins.getattr, *_numpy_globals()])
