"""Building blocks of the models: the equivariant layers (e2cnn, C8 regular fields) and their
field batch norm, the ops' modules as registry entries (op_modules), and the fixed-size
class-wise NMS of the heads."""
from . import op_modules  # noqa: F401  (registers the ops' modules)
from .equivariant import convert_to_plain, isolate_e2cnn_bases
from .field_batch_norm import FieldBatchNorm
from .multiclass_nms import FixedSizeDetections, multiclass_nms_fixed

__all__ = ['FieldBatchNorm', 'FixedSizeDetections', 'convert_to_plain', 'isolate_e2cnn_bases',
           'multiclass_nms_fixed']
