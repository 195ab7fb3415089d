"""SyntheticDOTADataset: DOTADataset over the synthetic data set, generated on first use."""
import gc
import os.path as osp
import weakref
from typing import Dict, List, Optional, Tuple

from mmdet.registry import DATASETS
from mmengine.dist import barrier, get_dist_info

from redet_plugin.utils.registration import register

from .dota import DOTADataError, DOTADataset
from .synthetic import SYNTHETIC_CLASSES, ensure_synthetic_dota, synthetic_params

# folder (real path) -> (parameters, weak reference) of each SyntheticDOTADataset of this process
# loaded from it: regenerating a folder under a live data set would change the images under its
# labels, silently.
_LOADED: Dict[str, List[Tuple[dict, weakref.ref]]] = {}


def _params_in_use(root: str, params: dict) -> Optional[dict]:
    """Other parameters a live data set of this process loaded `root` with, or None."""
    _LOADED[root] = [(p, ref) for p, ref in _LOADED.get(root, []) if ref() is not None]
    return next((p for p, _ in _LOADED[root] if p != params), None)


@register(DATASETS)
class SyntheticDOTADataset(DOTADataset):
    """A DOTADataset whose `data_root` is filled by `ensure_synthetic_dota(data_root, **synthetic)`
    before loading (only rank 0 generates; the other ranks wait).

    Args:
        synthetic: arguments of generate_synthetic_dota (num_train, num_val, image_size, seed,
            classes). Changing them regenerates the data set. Two data sets alive at once (the
            train and val loaders of one config) must give one folder the same parameters:
            the second refuses (DOTADataError) rather than regenerate under the first.
    Classes default to the synthetic ones (metainfo=dict(classes=...) must match synthetic['classes']).
    """

    METAINFO = dict(classes=SYNTHETIC_CLASSES,
                    palette=[(220, 20, 60), (0, 0, 230), (0, 160, 0), (255, 140, 0), (148, 0, 211)])

    def __init__(self, *args, synthetic: Optional[dict] = None, **kwargs) -> None:
        self.synthetic = dict(synthetic or {})
        data_root = kwargs.get('data_root')
        if not data_root:
            raise ValueError('SyntheticDOTADataset: data_root (where the data set is generated) is required')
        root = osp.realpath(osp.expanduser(data_root))
        params = synthetic_params(**self.synthetic)
        other = _params_in_use(root, params)
        if other is not None:
            gc.collect()  # a data set only a reference cycle still holds is not in use
            other = _params_in_use(root, params)
        if other is not None:
            raise DOTADataError(
                f'SyntheticDOTADataset: {data_root!r} is in use with the synthetic parameters '
                f'{other}; these are {params}, and generating them there would change the images '
                f'under the other data set: give every data loader the same synthetic parameters, '
                f'or another data_root')
        rank, world_size = get_dist_info()
        if rank == 0:
            ensure_synthetic_dota(osp.expanduser(data_root), **self.synthetic)
        if world_size > 1:
            barrier()
        super().__init__(*args, **kwargs)
        _LOADED[root].append((params, weakref.ref(self)))
