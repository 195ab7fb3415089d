"""What the checkpoint converters (tools/model_converters/) share: our model from a config,
checkpoints in and out."""
import os.path as osp
import sys

import torch


def build_model(config_path: str):
    """Our detector from `config_path` (its custom_imports load redet_plugin.mm), in eval mode."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    if not osp.isfile(config_path):
        sys.exit(f'error: config file {config_path!r} does not exist')
    cfg = Config.fromfile(config_path)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    return MODELS.build(cfg.model).eval()


def load_strictly(model, checkpoint_path: str) -> dict:
    """Loads the checkpoint's weights through the model's load hooks (mmrotate's layout is
    accepted); every key must fit. Returns the checkpoint's meta."""
    from mmengine.runner import load_checkpoint
    if not osp.isfile(checkpoint_path):
        sys.exit(f'error: checkpoint {checkpoint_path!r} does not exist')
    checkpoint = load_checkpoint(model, checkpoint_path, map_location='cpu', strict=True)
    return dict(checkpoint.get('meta', {})) if isinstance(checkpoint, dict) else {}


def save_weights(state_dict: dict, meta: dict, out_path: str, converted_by: str) -> None:
    """Weights and meta only: optimizer and scheduler states belong to the run that saved them."""
    meta = dict(meta, converted_by=converted_by)
    torch.save({'meta': meta, 'state_dict': {k: v.detach().cpu() for k, v in state_dict.items()}},
               out_path)
