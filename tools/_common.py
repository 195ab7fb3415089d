"""Helpers shared by tools/train.py and tools/test.py: clear errors before the Runner starts."""
import contextlib
import os
import os.path as osp
import sys
from typing import Optional

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
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg


def setup_cpu_distributed(cfg) -> None:
    """Without a GPU, processes launched by torchrun (tools/dist_*.sh, --launcher pytorch) run on
    the CPU over gloo. mmengine's own set-up needs a GPU per process: its pytorch launcher calls
    torch.cuda.set_device, and its DDP wrapper passes device_ids, which DDP refuses for a model
    on the CPU. So the process group is started here (gloo instead of the config's nccl, the
    config's other dist_cfg arguments kept) and the wrapper gets device_ids=None. On a machine
    with a GPU nothing changes."""
    import datetime

    import torch
    import torch.distributed as dist
    if cfg.launcher == 'none' or torch.cuda.is_available() or dist.is_initialized():
        return
    if cfg.launcher != 'pytorch':
        fail(f'--launcher {cfg.launcher}: without a GPU only --launcher pytorch (torchrun, '
             f'tools/dist_train.sh, tools/dist_test.sh) runs several processes on the CPU')
    if not dist.is_available() or not dist.is_gloo_available():
        fail('--launcher pytorch without a GPU needs torch.distributed with gloo, which this '
             'torch lacks')
    env_cfg = dict(cfg.get('env_cfg') or {})
    dist_cfg = dict(env_cfg.get('dist_cfg') or {})
    if dist_cfg.get('backend', 'gloo') not in ('gloo', 'nccl'):
        fail(f"env_cfg.dist_cfg.backend: {dist_cfg['backend']!r} cannot run on the CPU; use gloo")
    dist_cfg['backend'] = 'gloo'
    cfg.env_cfg = dict(env_cfg, dist_cfg=dist_cfg)  # (the config the run logs and saves)
    kwargs = {k: v for k, v in dist_cfg.items() if k != 'backend'}
    if kwargs.get('timeout') is not None:  # seconds in the config, as mmengine takes it
        kwargs['timeout'] = datetime.timedelta(seconds=kwargs['timeout'])
    dist.init_process_group(backend='gloo', **kwargs)
    wrapper = cfg.get('model_wrapper_cfg')
    if wrapper is None:  # mmengine's default wrapper, as its Runner builds it
        wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                       find_unused_parameters=cfg.get('find_unused_parameters', False))
    cfg.model_wrapper_cfg = dict(wrapper, device_ids=None)


def end_distributed() -> None:
    """Ends the process group, once every process has come here. A process that exited first
    would take rank 0's store away from one still ending its group: that one then aborts at exit
    ("terminate called without an active exception") after a run that went well."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


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
                     f'or make the synthetic set: python tools/data/make_synthetic_dota.py)')


@contextlib.contextmanager
def data_errors_in_one_line():
    """A data set that cannot be used as configured (DOTADataError: no images, no object of the
    classes, a bad annotation line, ...) stops the tool with its message instead of a traceback."""
    from redet_plugin.datasets import DOTADataError
    try:
        yield
    except DOTADataError as error:
        fail(data_error_message(error))


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


def check_checkpoint_matches(model, checkpoint_path: str, strict: bool = True) -> dict:
    """redet_plugin.utils.checkpoint_check.load_checked_checkpoint (the weights are loaded into
    `model` on the way; the Runner loads the same file next), its error as one line."""
    from redet_plugin.utils.checkpoint_check import CheckpointMismatchError, load_checked_checkpoint
    try:
        return load_checked_checkpoint(model, checkpoint_path, strict)
    except CheckpointMismatchError as error:
        fail(str(error))


def check_classes(model, dataset, checkpoint: Optional[dict] = None,
                  checkpoint_path: str = '') -> None:
    """The data set's classes must be the model's and the checkpoint's (else the metric scores
    each prediction as another class, and format_only fails after the whole inference)."""
    from redet_plugin.utils.checkpoint_check import CheckpointMismatchError, check_model_classes
    try:
        check_model_classes(model, dataset.metainfo.get('classes') or (), checkpoint, checkpoint_path)
    except CheckpointMismatchError as error:
        fail(str(error))
