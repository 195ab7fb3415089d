"""A config's model as initialised, saved as a checkpoint: for benchmarks that run the tools, or
compare two ways of running one model, without a trained one."""


def save_initial_checkpoint(config: str, path: str, seed: int = 0) -> None:
    """The config's model initialised from `seed`, saved at `path` with the classes of the
    config's test set (tools/test.py and RotatedDetector refuse a checkpoint of other classes)."""
    import torch
    from mmdet.registry import DATASETS, MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import redet_plugin.mm  # noqa: F401
    init_default_scope('mmdet')
    cfg = Config.fromfile(config)
    dataset = cfg.test_dataloader.dataset
    classes = (dataset.get('metainfo') or {}).get('classes') or \
        DATASETS.get(dataset.type).METAINFO['classes']
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': tuple(classes)}}}, path)
