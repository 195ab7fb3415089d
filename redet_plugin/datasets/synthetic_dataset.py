"""SyntheticDOTADataset: DOTADataset over the synthetic data set, generated on first use."""
import os.path as osp
from typing import Optional

from mmdet.registry import DATASETS
from mmengine.dist import barrier, get_dist_info

from redet_plugin.utils.registration import register

from .dota import DOTADataset
from .synthetic import SYNTHETIC_CLASSES, ensure_synthetic_dota


@register(DATASETS)
class SyntheticDOTADataset(DOTADataset):
    """A DOTADataset whose `data_root` is filled by `ensure_synthetic_dota(data_root, **synthetic)`
    before loading (only rank 0 generates; the other ranks wait).

    Args:
        synthetic: arguments of generate_synthetic_dota (num_train, num_val, image_size, seed,
            classes). Changing them regenerates the data set.
    Classes default to the synthetic ones (metainfo=dict(classes=...) must match synthetic['classes']).
    """

    METAINFO = dict(classes=SYNTHETIC_CLASSES,
                    palette=[(220, 20, 60), (0, 0, 230), (0, 160, 0), (255, 140, 0), (148, 0, 211)])

    def __init__(self, *args, synthetic: Optional[dict] = None, **kwargs) -> None:
        self.synthetic = dict(synthetic or {})
        data_root = kwargs.get('data_root')
        if not data_root:
            raise ValueError('SyntheticDOTADataset: data_root (where the data set is generated) is required')
        rank, world_size = get_dist_info()
        if rank == 0:
            ensure_synthetic_dota(osp.expanduser(data_root), **self.synthetic)
        if world_size > 1:
            barrier()
        super().__init__(*args, **kwargs)
