"""isolate_e2cnn_bases on mmrotate's models. mmrotate builds plain e2cnn R2Convs, and e2cnn hands
every R2Conv with the same basis one shared basis module: converting or moving one mmrotate model
changes the basis under every other. After isolation a model changes only itself."""
import pytest
import torch
from e2cnn.nn import GeometricTensor
from mmengine.registry import DefaultScope

from tests._helpers import register_mmrotate

register_mmrotate()
from mmrotate.registry import MODELS as MMROTATE_MODELS  # noqa: E402
from redet_plugin.models import isolate_e2cnn_bases  # noqa: E402
from redet_plugin.models.layers.equivariant import to_plain  # noqa: E402

IN_CHANNELS = [16, 32]
# (convert one model, undo it): the undo keeps a shared basis from leaking into later tests
CHANGES = {
    'double': (lambda m: m.double(), lambda m: m.float()),
    'cuda': pytest.param((lambda m: m.cuda(), lambda m: m.cpu()), marks=pytest.mark.cuda),
}


def build_refpn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope('mmrotate'):
        return MMROTATE_MODELS.build(dict(type='ReFPN', in_channels=IN_CHANNELS, out_channels=16,
                                          num_outs=3, add_extra_convs=True))


@torch.no_grad()
def run(model):
    """Outputs in the model's dtype, on its device. The eval-mode filters are expanded from the
    basis again first, so a basis changed under the model's feet shows up here."""
    p = next(model.parameters())
    g = torch.Generator().manual_seed(1)
    inputs = [GeometricTensor(torch.randn(1, c, 16 >> i, 16 >> i, generator=g).to(p),
                              conv.conv.in_type)
              for i, (c, conv) in enumerate(zip(IN_CHANNELS, model.lateral_convs))]
    model.train()
    model.eval()
    return [to_plain(o).clone() for o in model(inputs)]


def basis_storages(model) -> set:
    return {t.untyped_storage().data_ptr() for name, t in model.named_buffers()
            if 'basisexpansion' in name and t.numel() > 0}


def test_mmrotate_models_share_e2cnn_bases():
    """What isolation is for: without it, .double() on one model breaks the other."""
    a, b = build_refpn(0), build_refpn(1)
    assert basis_storages(a) & basis_storages(b)
    a.double()
    try:
        with pytest.raises(RuntimeError):
            run(b)  # float weights, a double basis
    finally:
        a.float()  # e2cnn's process-wide basis back to float for later tests
    run(b)


@pytest.mark.parametrize('change', CHANGES.values(), ids=CHANGES.keys())
def test_converting_an_isolated_model_leaves_the_other(change):
    convert, undo = change
    a, b = build_refpn(0), build_refpn(1)
    keys = set(a.state_dict())
    a_before, b_before = run(a), run(b)
    assert isolate_e2cnn_bases(a) is a
    isolate_e2cnn_bases(b)
    assert set(a.state_dict()) == keys  # checkpoints still load
    for out, old in zip(run(a), a_before):  # the same numbers, now its own
        torch.testing.assert_close(out, old, rtol=0, atol=0)
    assert not basis_storages(a) & basis_storages(b)
    assert not basis_storages(a) & basis_storages(build_refpn(2))  # nor e2cnn's shared one
    convert(a)
    try:
        for out, old in zip(run(b), b_before):
            assert out.dtype == torch.float32 and out.device.type == 'cpu'
            torch.testing.assert_close(out, old, rtol=0, atol=0)
        p = next(a.parameters())
        for out, old in zip(run(a), a_before):  # loose: convs on a GPU may round inputs to TF32
            assert (out.dtype, out.device) == (p.dtype, p.device)
            torch.testing.assert_close(out.cpu().float(), old, rtol=1e-2, atol=1e-2)
    finally:
        undo(a)
