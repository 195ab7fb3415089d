"""What the command-line tools (tools/train.py, tools/test.py, tools/infer.py) share: their runner
arguments and config, and errors in one readable line before the Runner starts."""
import contextlib
import os
import os.path as osp
import sys
from typing import Optional, Sequence

import torch
from mmengine.config import DictAction


def fail(message: str) -> None:
    """Stops the tool with one readable line instead of a traceback."""
    sys.exit(f'error: {message}')


def add_runner_args(parser) -> None:
    """--cfg-options, --launcher and --local-rank, as mmdet's tools have them."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_epochs=1')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_runner_args(parser, argv):
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    use_expandable_segments()
    return args


def use_expandable_segments() -> None:
    """Unless the user configured torch's CUDA allocator, it grows its segments in place: a
    detector's step allocates tensors of changing sizes (gts per image, kept proposals), and
    fixed segments fragment until the reserved memory is far above what is allocated. Read
    when CUDA first allocates, so it must be set before that."""
    names = ('PYTORCH_ALLOC_CONF', 'PYTORCH_CUDA_ALLOC_CONF')
    if not any(name in os.environ for name in names):
        # torch >= 2.9 reads PYTORCH_ALLOC_CONF and warns that the older name is deprecated
        version = tuple(int(part) for part in torch.__version__.split('.')[:2])
        os.environ[names[0] if version >= (2, 9) else names[1]] = 'expandable_segments:True'


def load_config(args):
    """The config named on the command line, with --cfg-options, the launcher and the work dir
    (--work-dir, else the config's, else work_dirs/<config name>) applied."""
    from mmengine.config import Config
    if not osp.isfile(args.config):
        fail(f'config file {args.config!r} does not exist')
    cfg = Config.fromfile(args.config)
    # The config's text unformatted: the Runner formats it with yapf three times as it starts
    # (logged, dumped to the work dir, given to the visualizer) and again into every checkpoint,
    # most of the time it took to build the Runner, for text that reads and loads the same.
    # (mmengine 0.10's fromfile drops its format_python_code argument for .py configs.)
    object.__setattr__(cfg, '_format_python_code', False)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg


def check_data_folders(cfg, loader_keys) -> None:
    """Every dataset folder a config names must exist; name the config key and the path."""
    for key in loader_keys:
        loader = cfg.get(key)
        if not loader:
            continue
        dataset = loader.dataset
        if dataset.get('synthetic') is not None:  # SyntheticDOTADataset generates its folders
            continue
        root = dataset.get('data_root') or ''
        folders = {'data_root': root} if root else {}
        if dataset.get('ann_file'):
            folders['ann_file'] = osp.join(root, dataset.ann_file)
        for name, path in (dataset.get('data_prefix') or {}).items():
            folders[f'data_prefix.{name}'] = osp.join(root, path)
        for name, path in folders.items():
            if not osp.exists(path):
                fail(f'{key}.dataset.{name}: {path!r} does not exist '
                     f'(set data_root to a DOTA-format folder with images/ and labelTxt/, '
                     f'or make the synthetic set: '
                     f'python tools/dataset_converters/make_synthetic_dota.py)')


@contextlib.contextmanager
def data_errors_in_one_line():
    """A data set that cannot be used as configured (DOTADataError: no images, no object of the
    classes, a bad annotation line, ...) stops the tool with its message instead of a traceback."""
    from ..datasets import DOTADataError
    try:
        yield
    except DOTADataError as error:
        fail(data_error_message(error))


@contextlib.contextmanager
def training_stops_in_one_line():
    """A training that stops itself (too many non-finite steps in a row: NonFiniteStepsError)
    ends the tool with its one line instead of a traceback."""
    from .nonfinite_steps_hook import NonFiniteStepsError
    try:
        yield
    except NonFiniteStepsError as error:
        fail(str(error))


def data_error_message(error: BaseException) -> str:
    """The error's message; for one raised in a data loader worker (torch raises it again in the
    main process with the worker's whole traceback as its text), the worker's own message."""
    text = str(error)
    if text.startswith('Caught ') and 'Original Traceback' in text:
        lines = [line for line in text.splitlines() if line.strip()]
        name = f'{type(error).__module__}.{type(error).__qualname__}: '
        for number in range(len(lines) - 1, -1, -1):  # the last 'module.Class: message' line
            if lines[number].startswith(name):
                return ' '.join([lines[number][len(name):], *lines[number + 1:]])
    return text


@contextlib.contextmanager
def checked_checkpoint_load(runner, checkpoint_path: Optional[str] = None, strict: bool = True,
                            classes: Optional[Sequence[str]] = None):
    """Around runner.train() or runner.test(): the Runner reads local checkpoints weights-only
    (utils.checkpoint_check.weights_only_reads), and the one it loads from `checkpoint_path`
    (load_from, resume) is checked when read (CheckpointCheckHook: `strict`, `classes`). A
    checkpoint that cannot be read, does not fit the model or was trained on other classes
    stops the tool with one line. The file is read once, by the Runner."""
    from ..utils.checkpoint_check import CheckpointMismatchError, weights_only_reads
    from .checkpoint_check_hook import CheckpointCheckHook
    if checkpoint_path is not None:
        runner.register_hook(CheckpointCheckHook(checkpoint_path, strict, classes))
    try:
        with weights_only_reads():
            yield
    except CheckpointMismatchError as error:
        fail(str(error))


def check_classes(model, dataset) -> None:
    """The data set's classes must be the model's (else the metric scores each prediction as
    another class, and format_only fails after the whole inference)."""
    from ..utils.checkpoint_check import CheckpointMismatchError, check_model_classes
    try:
        check_model_classes(model, dataset.metainfo.get('classes') or ())
    except CheckpointMismatchError as error:
        fail(str(error))


def gpu_available() -> bool:
    """A device mmengine's mixed precision accepts (its AmpOptimWrapper, its loops' autocast)."""
    from mmengine.device import (is_cuda_available, is_mlu_available, is_musa_available,
                                 is_npu_available)
    return any(f() for f in (is_cuda_available, is_npu_available, is_mlu_available,
                             is_musa_available))
