"""The compiled ops: functional forms and nn.Modules."""
from .riroi_align_rotated import (RiRoIAlignRotated, riroi_align_rotated,
                                  riroi_align_rotated_multilevel)
from .roi_pool import RoIPool, roi_pool

__all__ = ["RiRoIAlignRotated", "RoIPool", "riroi_align_rotated",
           "riroi_align_rotated_multilevel", "roi_pool"]
