"""The mm layer: registers redet_plugin's components in mmdet's registries.

`custom_imports=dict(imports=['redet_plugin.mm'], allow_failed_imports=False)` in any OpenMMLab
config (mmdet, mmrotate, ...) loads it; `import redet_plugin` does the same when mmengine is
already loaded (as it is whenever a config's custom_imports run). Its side effects, all here:
- every model, dataset, transform, metric, visualizer and hook is registered in mmdet's
  registries as 'Redet' + its class name (names no other project uses;
  redet_plugin/utils/registration.py),
- the box type 'redet_rbox' (RotatedBoxes) and its converters to and from 'hbox' are registered
  with mmdet's box-type registry (mmrotate's 'rbox' is left alone),
- torch's weights-only unpickler is allowed the objects mmengine 0.10 stores in checkpoints
  (redet_plugin/utils/checkpoint_compat.py), so resume and load_from work under torch >= 2.6.
The ops layer (redet_plugin.ops) needs none of this.
"""
from .utils.checkpoint_compat import register_checkpoint_safe_globals

register_checkpoint_safe_globals()

from . import structures, datasets, engine, evaluation, models, visualization  # noqa: E402,F401
