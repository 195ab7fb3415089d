"""tools/train.py and tools/test.py under torchrun (tools/dist_*.sh, --launcher pytorch) on a
machine without a GPU: the processes run on the CPU over gloo."""
import datetime
import gc

import torch
import torch.distributed as dist

from .cli import fail


def setup_cpu_distributed(cfg) -> None:
    """Without a GPU, processes launched by torchrun run on the CPU over gloo. mmengine's own
    set-up needs a GPU per process: its pytorch launcher calls torch.cuda.set_device, and its DDP
    wrapper passes device_ids, which DDP refuses for a model on the CPU. So the process group is
    started here (gloo instead of the config's nccl, the config's other dist_cfg arguments kept)
    and the wrapper gets device_ids=None. On a machine with a GPU nothing changes."""
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
    """Ends the process group, once every process has come here and has let go of its Runner.
    A DistributedDataParallel wrapper still alive holds the group (its reducer); torch then tears
    that group down at interpreter exit, and a process whose peer has exited by then aborts
    ("terminate called without an active exception") after a run that went well. The Runner is
    in reference cycles (its hooks), so only the garbage collector frees it."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
