"""e2cnn's block basis expansion, naming its basis elements only when asked.

e2cnn's BlocksBasisExpansion gives every basis element of every pair of fields a formatted name
when it is built: about 1.6 million strings for ReResNet-50, three quarters of the model's
construction, paid at every start of a tool. Only get_basis_names and get_element_info read the
names; the expansion's size (dimension(), the length of the conv's weights) needs their count
only. LazyNamesBasisExpansion counts them at construction and names them on first request with
e2cnn's own function, so names and order are e2cnn's. e2cnn 0.2.3 is its last release.
"""
import contextlib
from collections import Counter

from e2cnn.nn.modules.r2_conv import basisexpansion_blocks, r2convolution

_name_basis = basisexpansion_blocks._compute_attrs_and_ids


class _NameCount:
    """Stands in for a list of `count` names: it has their number, and no items to iterate."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(())


def _count_basis(in_type, out_type, block_expansions) -> dict:
    """What _compute_attrs_and_ids returns, counted: each pair of representations' expansion
    repeats for every pair of fields of those representations."""
    in_fields = Counter(r.name for r in in_type.representations)
    out_fields = Counter(r.name for r in out_type.representations)
    return {pair: _NameCount(in_fields[pair[0]] * out_fields[pair[1]] * block.dimension())
            for pair, block in block_expansions.items()}


class LazyNamesBasisExpansion(basisexpansion_blocks.BlocksBasisExpansion):

    def __init__(self, *args, **kwargs):
        basisexpansion_blocks._compute_attrs_and_ids = _count_basis
        try:
            super().__init__(*args, **kwargs)
        finally:
            basisexpansion_blocks._compute_attrs_and_ids = _name_basis
        self._dimension = max((end for _, end in self._weights_ranges.values()), default=0)
        self._named = False

    def dimension(self) -> int:
        return self._dimension

    def get_basis_names(self):
        self._name_elements()
        return super().get_basis_names()

    def get_element_info(self, name):
        self._name_elements()
        return super().get_element_info(name)

    def _name_elements(self) -> None:
        if self._named:
            return
        blocks = {pair: getattr(self, f'block_expansion_{pair}')
                  for pair in self._representations_pairs}
        names = _name_basis(self._in_type, self._out_type, blocks)
        ordered = [name for pair in self._representations_pairs for name in names[pair]]
        # new containers: copies of one prototype (equivariant._bare_r2conv) share the old ones
        self._basis_to_ids = ordered
        self._ids_to_basis = {name: index for index, name in enumerate(ordered)}
        self._named = True


@contextlib.contextmanager
def lazily_named_bases():
    """R2Convs built in the block get a LazyNamesBasisExpansion (e2cnn's other users in the
    process keep its own)."""
    r2convolution.BlocksBasisExpansion = LazyNamesBasisExpansion
    try:
        yield
    finally:
        r2convolution.BlocksBasisExpansion = basisexpansion_blocks.BlocksBasisExpansion
