"""Equivariant convs are built once per layout and copied (equivariant._bare_r2conv): a model
built so equals one whose every conv e2cnn built from scratch, and no two convs share a tensor."""
import pytest
import torch
from e2cnn import nn as enn

from redet_plugin.models.layers import equivariant
from redet_plugin.models.layers.equivariant import CachedFilterR2Conv, r2conv, regular_type
from tests.test_models.test_model_isolation import build, example


def _from_scratch(in_type, out_type, kernel_size, stride=1, padding=0, bias=False):
    return CachedFilterR2Conv(in_type, out_type, kernel_size, stride=stride, padding=padding,
                              bias=bias, sigma=None, frequencies_cutoff=lambda r: 3 * r,
                              initialize=False)


@pytest.mark.parametrize('kind', ['backbone', 'neck'])
def test_a_model_of_copies_equals_one_built_from_scratch(kind, monkeypatch):
    copies = build(kind, torch.float64, seed=0)
    monkeypatch.setattr(equivariant, '_bare_r2conv', _from_scratch)
    scratch = build(kind, torch.float64, seed=0)
    ours, theirs = copies.state_dict(), scratch.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    x = example(kind, torch.float64, 'cpu')
    with torch.no_grad():
        for a, b in zip(copies(x), scratch(x)):
            assert torch.equal(a, b)


def test_two_convs_of_one_layout_share_no_tensor_and_keep_the_callers_field_types():
    in_type, out_type = regular_type(32), regular_type(64)
    a = r2conv(in_type, out_type, 3, padding=1)
    b = r2conv(regular_type(32), regular_type(64), 3, padding=1)
    assert a.in_type is in_type and a.out_type is out_type
    assert b.in_type is not in_type and b.in_type == in_type
    tensors = lambda conv: {t.data_ptr() for t in [*conv.parameters(), *conv.buffers()]}
    assert not tensors(a) & tensors(b)
    with torch.no_grad():
        b.weights.copy_(a.weights)
    x = enn.GeometricTensor(torch.randn(1, 32, 12, 12), in_type)
    b.double()  # (a's basis stays as it was)
    y = b(enn.GeometricTensor(x.tensor.double(), b.in_type)).tensor
    torch.testing.assert_close(a(x).tensor, y.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('layout', [('trivial', 3, 'regular', 64, 7), ('regular', 64, 'regular', 64, 3),
                                    ('regular', 32, 'regular', 128, 1)])
def test_lazily_named_basis_equals_e2cnns(layout):
    """The conv's basis counts its elements at construction and names them when asked: the same
    size, names, element infos and filters as e2cnn's own expansion."""
    from redet_plugin.models.layers.equivariant import trivial_type
    from redet_plugin.models.layers.lazy_basis_names import LazyNamesBasisExpansion
    types = {'trivial': trivial_type, 'regular': regular_type}
    in_type, out_type = types[layout[0]](layout[1]), types[layout[2]](layout[3])
    settings = dict(padding=layout[4] // 2, sigma=None, frequencies_cutoff=lambda r: 3 * r,
                    initialize=False)
    ours = CachedFilterR2Conv(in_type, out_type, layout[4], **settings)
    theirs = enn.R2Conv(in_type, out_type, layout[4], **settings)
    assert isinstance(ours.basisexpansion, LazyNamesBasisExpansion)
    assert type(theirs.basisexpansion) is not LazyNamesBasisExpansion
    assert ours.basisexpansion.dimension() == theirs.basisexpansion.dimension() > 0
    assert ours.basisexpansion.get_basis_names() == theirs.basisexpansion.get_basis_names()
    last = theirs.basisexpansion.dimension() - 1
    for name in (0, last, theirs.basisexpansion.get_basis_names()[last // 2]):
        assert ours.basisexpansion.get_element_info(name) == theirs.basisexpansion.get_element_info(name)
    with torch.no_grad():
        theirs.weights.copy_(torch.randn_like(theirs.weights))
        ours.weights.copy_(theirs.weights)
    torch.testing.assert_close(ours.eval().filter, theirs.eval().filter, rtol=0, atol=0)
