"""A config's model as initialised, saved as a checkpoint: for benchmarks that run the tools, or
compare two ways of running one model, without a trained one."""


def save_initial_checkpoint(config: str, path: str, seed: int = 0) -> None:
    """The config's model initialised from `seed`, saved at `path` with the classes of the
    config's test set (tools/test.py and RotatedDetector refuse a checkpoint of other classes).
    A config of mmrotate (default scope mmrotate) is built from mmrotate's registries."""
    import torch
    from mmdet.registry import DATASETS, MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(config)
    scope = cfg.get('default_scope') or 'mmdet'
    if scope == 'mmrotate':  # (its configs name its modules without a scope prefix)
        from mmrotate.utils import register_all_modules
        register_all_modules(init_default_scope=False)
    else:
        import redet_plugin.mm  # noqa: F401
    init_default_scope(scope)
    dataset = cfg.test_dataloader.dataset
    with DATASETS.switch_scope_and_registry(scope) as datasets:
        classes = (dataset.get('metainfo') or {}).get('classes') or \
            datasets.get(dataset.type).METAINFO['classes']
    torch.manual_seed(seed)
    with MODELS.switch_scope_and_registry(scope) as models:
        model = models.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': tuple(classes)}}}, path)
