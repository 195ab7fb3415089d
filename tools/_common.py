"""Helpers shared by tools/train.py and tools/test.py: clear errors before the Runner starts."""
import contextlib
import os
import os.path as osp
import sys
from typing import Optional

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
    return args


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
        fail(str(error))


def check_checkpoint_matches(model, checkpoint_path: str, strict: bool = True) -> dict:
    """Refuses a checkpoint whose weights do not fit the model (another architecture, another
    number of classes), naming a few of the offending parameters. strict=False (load_from:
    fine-tuning may change the heads) refuses only one of which most weights do not fit.
    Keys pass through the model's load hooks (mmrotate's ReDet layout is accepted), so the
    weights are loaded into `model` on the way; the Runner loads the same file next.
    Returns the checkpoint."""
    import torch
    from mmengine.model import is_model_wrapper
    if is_model_wrapper(model):
        model = model.module
    try:
        checkpoint = torch.load(checkpoint_path, map_location='cpu')
    except Exception as error:  # truncated file, not a checkpoint at all
        fail(f'checkpoint {checkpoint_path!r} cannot be read: {error}')
    state = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        fail(f'checkpoint {checkpoint_path!r} holds no state_dict')
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    expected = model.state_dict()
    wrong_shape = {k: f'{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}'
                   for k, v in expected.items() if k in state and hasattr(state[k], 'shape')
                   and tuple(state[k].shape) != tuple(v.shape)}
    try:  # the others, to find what the load hooks make of their keys
        missing, unexpected = model.load_state_dict(
            {k: v for k, v in state.items() if k not in wrong_shape}, strict=False)
    except RuntimeError as error:  # a wrong shape under a key the load hooks rename
        fail(f'checkpoint {checkpoint_path!r} is from a different model: {error}')
    missing = [k for k in missing if k not in wrong_shape]
    matched = len(expected) - len(missing) - len(wrong_shape)
    different = (missing or unexpected or wrong_shape) if strict else matched < len(expected) / 2
    if different:
        wrong_shape = list(wrong_shape.values())
        fail(f'checkpoint {checkpoint_path!r} is from a different model: '
             f'{len(missing)} missing, {len(unexpected)} unexpected, {len(wrong_shape)} '
             f'wrong-shape weights of the model\'s {len(expected)} (e.g. missing {missing[:3]}, '
             f'unexpected {unexpected[:3]}, wrong shape {wrong_shape[:3]})')
    return checkpoint


def check_classes(model, dataset, checkpoint: Optional[dict] = None,
                  checkpoint_path: str = '') -> None:
    """The data set's classes must be the model's: its bbox heads' num_classes, and the classes
    the checkpoint was trained on (meta.dataset_meta.classes, where saved). Else the metric
    scores each prediction as another class, and format_only fails after the whole inference."""
    from mmdet.models.roi_heads.bbox_heads import BBoxHead
    classes = list(dataset.metainfo.get('classes') or ())
    saved = ((checkpoint or {}).get('meta') or {}).get('dataset_meta') or {}
    if saved.get('classes') is not None and list(saved['classes']) != classes:
        fail(f'checkpoint {checkpoint_path!r} was trained on {len(saved["classes"])} classes '
             f'{list(saved["classes"])}, the data set has {len(classes)}: {classes} '
             f'(set the data set\'s metainfo.classes to the checkpoint\'s)')
    for head in model.modules():
        if isinstance(head, BBoxHead) and head.num_classes != len(classes):
            fail(f'the model predicts {head.num_classes} classes (bbox head num_classes), the '
                 f'data set has {len(classes)}: {classes}')
