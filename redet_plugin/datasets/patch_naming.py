"""Names of split patches, DOTA devkit style: `<image>__<rate>__<left>___<top>`, where (left, top)
is the patch's corner in the image scaled by `rate`. The splitter (dota_split) writes them and the
evaluation (patch_merge) reads them back to map detections onto the full images.
"""
import re
from typing import Tuple

PATCH_ID = re.compile(r'^(?P<name>.+)__(?P<rate>[0-9.]+)__(?P<left>-?\d+)___(?P<top>-?\d+)$')


def patch_id(name: str, rate: float, left: int, top: int) -> str:
    """The devkit's patch id (rate written as the devkit does: `1` for 1.0, `0.5` for 0.5)."""
    return f'{name}__{rate:g}__{left}___{top}'


def parse_patch_id(img_id: str) -> Tuple[str, float, int, int]:
    """`P0001__1__824___0` -> ('P0001', 1.0, 824, 0); a plain id (a full image) -> (id, 1.0, 0, 0)."""
    match = PATCH_ID.match(img_id)
    if match is None:
        return img_id, 1.0, 0, 0
    return match['name'], float(match['rate']), int(match['left']), int(match['top'])
