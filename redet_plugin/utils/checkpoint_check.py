"""Refusing checkpoints that do not fit a model, with one readable line: the one check of
tools/train.py and tools/test.py (on the Runner's load, redet_plugin/engine/checkpoint_check_hook.py)
and of redet_plugin.inference.

mmengine reads and loads checkpoints (CheckpointLoader, revise_keys); kept here is what it lacks:
a weights-only read (its local reader calls torch.load without weights_only) whose failures are
one line naming the file, and a check that says which weights do not fit instead of loading
what fits and warning about the rest."""
import contextlib
from typing import Optional, Sequence


class CheckpointMismatchError(ValueError):
    """A checkpoint cannot be read, or does not fit the model or its classes; the message is one
    line naming the file."""


def read_checkpoint(checkpoint_path: str, map_location='cpu'):
    """torch.load(weights_only=True) of a user's checkpoint: tensors, plain values and the
    mmengine objects redet_plugin allows (utils/checkpoint_compat.py); any other Python object
    refuses the file before it is built (nothing of it runs). Every failure is a
    CheckpointMismatchError of one line naming the file: missing, empty, cut short, not a
    checkpoint, or holding other objects."""
    import os
    import warnings

    import torch
    if not os.path.isfile(checkpoint_path):
        raise CheckpointMismatchError(f'checkpoint {checkpoint_path!r} does not exist')
    try:
        with warnings.catch_warnings():  # (torch warns about legacy files; the error says it all)
            warnings.simplefilter('ignore')
            return torch.load(checkpoint_path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 (torch.load raises many kinds)
        raise CheckpointMismatchError(
            f'checkpoint {checkpoint_path!r} {_unreadable_reason(checkpoint_path, error)}') from None


def load_from_local_weights_only(filename: str, map_location=None):
    """read_checkpoint as a loader of mmengine's CheckpointLoader (named so that mmengine logs
    'local_weights_only backend')."""
    return read_checkpoint(filename, map_location)


@contextlib.contextmanager
def weights_only_reads():
    """In the block, mmengine reads local checkpoint files (the Runner's load_from and resume,
    mmengine.runner.load_checkpoint) with read_checkpoint; URLs keep their loaders. Its own
    local loader comes back after the block."""
    from mmengine.runner.checkpoint import CheckpointLoader, load_from_local
    CheckpointLoader.register_scheme('', load_from_local_weights_only, force=True)
    try:
        yield
    finally:
        CheckpointLoader.register_scheme('', load_from_local, force=True)


def _unreadable_reason(path: str, error: Exception) -> str:
    import os
    import pickle
    import re
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) and 'Weights only load failed' in text:
        found = re.search(r'GLOBAL ([\w.]+)', text)
        if found:
            return (f'is refused: it holds Python objects other than weights ({found.group(1)}), '
                    f'which are not loaded (torch.load with weights_only=True); save its state_dict '
                    f'from a trusted copy instead')
        return ('is not a torch checkpoint (torch\'s weights-only reader refuses it: a plain '
                'pickle, or objects other than weights)')
    if os.path.getsize(path) == 0:
        return 'cannot be read: the file is empty'
    if isinstance(error, EOFError) or 'zip archive' in text or 'central directory' in text:
        first = text.split('. ')[0].strip() or type(error).__name__
        return f'cannot be read: the file is cut short or damaged ({first})'
    if isinstance(error, (KeyError, pickle.UnpicklingError, UnicodeDecodeError)):
        return 'is not a torch checkpoint (torch.load cannot read it)'
    first = text.splitlines()[0] if text else type(error).__name__
    return f'cannot be read: {first}'


def load_checked_checkpoint(model, checkpoint_path: str, strict: bool = True) -> dict:
    """read_checkpoint, then check_checkpoint_fits (which loads the weights into `model`).
    Returns the checkpoint."""
    checkpoint = read_checkpoint(checkpoint_path)
    check_checkpoint_fits(model, checkpoint, checkpoint_path, strict)
    return checkpoint


def check_checkpoint_fits(model, checkpoint, checkpoint_path: str, strict: bool = True) -> None:
    """Refuses a read checkpoint whose weights do not fit `model` (another architecture, another
    number of classes), naming a few of the offending parameters. strict=False (load_from:
    fine-tuning may change the heads) refuses only one of which most weights do not fit. Keys
    pass through the model's load hooks (mmrotate's ReDet layout is accepted), which is how the
    check finds them: the weights that fit are loaded into `model` on the way."""
    from mmengine.model import is_model_wrapper
    if is_model_wrapper(model):
        model = model.module
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise CheckpointMismatchError(f'checkpoint {checkpoint_path!r} holds no state_dict')
    # the keys as the Runner's load makes them (its revise_keys strip a wrapper's 'module.')
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    expected = model.state_dict()
    wrong_shape = {k: f'{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}'
                   for k, v in expected.items() if k in state and hasattr(state[k], 'shape')
                   and tuple(state[k].shape) != tuple(v.shape)}
    try:  # the others, to find what the load hooks make of their keys
        missing, unexpected = model.load_state_dict(
            {k: v for k, v in state.items() if k not in wrong_shape}, strict=False)
    except RuntimeError as error:  # a wrong shape under a key the load hooks rename
        first = str(error).replace('\n', ' ')
        raise CheckpointMismatchError(f'checkpoint {checkpoint_path!r} is from a different model: {first}') from None
    missing = [k for k in missing if k not in wrong_shape]
    matched = len(expected) - len(missing) - len(wrong_shape)
    different = (missing or unexpected or wrong_shape) if strict else matched < len(expected) / 2
    if different:
        wrong_shape = list(wrong_shape.values())
        raise CheckpointMismatchError(
            f'checkpoint {checkpoint_path!r} is from a different model: '
            f'{len(missing)} missing, {len(unexpected)} unexpected, {len(wrong_shape)} '
            f'wrong-shape weights of the model\'s {len(expected)} (e.g. missing {missing[:3]}, '
            f'unexpected {unexpected[:3]}, wrong shape {wrong_shape[:3]})')


def check_model_classes(model, classes: Sequence[str], checkpoint: Optional[dict] = None,
                        checkpoint_path: str = '', owner: str = 'the data set') -> None:
    """`classes` (those of `owner`: the data set, the config) must be the model's: its bbox
    heads' num_classes, and the classes the checkpoint was trained on (meta.dataset_meta.classes,
    where saved). Else every prediction is scored or named as another class."""
    from mmdet.models.roi_heads.bbox_heads import BBoxHead
    classes = list(classes or ())
    saved = ((checkpoint or {}).get('meta') or {}).get('dataset_meta') or {}
    if saved.get('classes') is not None and list(saved['classes']) != classes:
        raise CheckpointMismatchError(
            f'checkpoint {checkpoint_path!r} was trained on {len(saved["classes"])} classes '
            f'{list(saved["classes"])}, {owner} has {len(classes)}: {classes} '
            f'(set {owner}\'s metainfo.classes to the checkpoint\'s)')
    for head in model.modules():
        if isinstance(head, BBoxHead) and head.num_classes != len(classes):
            raise CheckpointMismatchError(
                f'the model predicts {head.num_classes} classes (bbox head num_classes), '
                f'{owner} has {len(classes)}: {classes}')
