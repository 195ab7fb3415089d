"""Models never share state: converting, moving, copying or loading one model leaves every other
model in the process as it was.

e2cnn caches the sampled basis of its R2Convs across instances; a conv that used that cache
directly would let `.double()` or `.cuda()` on one model move the basis of all others.
"""
import copy

import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.necks import ReFPN

NECK_IN = [8, 16, 32, 64]
# (kind, dtype) of the models living side by side in one process
ZOO = [("backbone", torch.float32), ("backbone", torch.float64),
       ("neck", torch.float32), ("neck", torch.float64)]


def build(kind, dtype, seed):
    torch.manual_seed(seed)
    if kind == "backbone":
        model = ReResNet(depth=18, base_channels=8)
    else:
        model = ReFPN(NECK_IN, 16, num_outs=5)
    return model.to(dtype).eval()


def example(kind, dtype, device):
    g = torch.Generator().manual_seed(1)
    if kind == "backbone":
        return torch.randn(1, 3, 32, 32, generator=g).to(device, dtype)
    return [torch.randn(1, c, 8 >> i, 8 >> i, generator=g).to(device, dtype)
            for i, c in enumerate(NECK_IN)]


def place(model):
    p = next(model.parameters())
    return p.dtype, p.device


@torch.no_grad()
def run(model, kind):
    """The outputs in the model's own dtype and on its device. The eval-mode filters are rebuilt
    from the basis first, so a basis moved under the model's feet shows up here."""
    dtype, device = place(model)
    model.train()
    model.eval()
    return [o.clone() for o in model(example(kind, dtype, device))]


def make_zoo():
    return [build(kind, dtype, seed) for seed, (kind, dtype) in enumerate(ZOO)]


def assert_as_before(zoo, before, skip=()):
    """Every model not in `skip` keeps its dtype and device and gives exactly its old outputs."""
    for i, ((kind, dtype), model) in enumerate(zip(ZOO, zoo)):
        if i in skip:
            continue
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            expected = dtype if t.is_floating_point() else t.dtype
            assert (t.dtype, t.device.type) == (expected, "cpu"), f"model {i} ({kind}): {name}"
        for out, old in zip(run(model, kind), before[i]):
            torch.testing.assert_close(out, old, rtol=0, atol=0)


def assert_close_to(outs, old, rtol):
    for out, ref in zip(outs, old):
        assert ((out.double().cpu() - ref.double()).norm() / ref.double().norm()).item() < rtol


def storages(model):
    tensors = list(model.parameters()) + list(model.buffers())
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel() > 0}


def test_no_two_models_share_a_tensor():
    zoo = make_zoo() + [build("backbone", torch.float32, 9)]
    for i, a in enumerate(zoo):
        for j, b in enumerate(zoo[:i]):
            assert not storages(a) & storages(b), f"models {j} and {i} share tensors"


@pytest.mark.parametrize("target", [0, 3], ids=["float_backbone", "double_neck"])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-5), (torch.float32, 1e-5),
                                        (torch.float16, 2e-2)], ids=["double", "float", "half"])
def test_dtype_conversion_of_one_model_leaves_the_others(target, dtype, rtol):
    zoo = make_zoo()
    before = [run(m, kind) for m, (kind, _) in zip(zoo, ZOO)]
    zoo[target].to(dtype)
    assert_as_before(zoo, before, skip={target})
    outs = run(zoo[target], ZOO[target][0])
    assert all(o.dtype == dtype for o in outs)
    assert_close_to(outs, before[target], rtol)


def test_moving_one_model_to_meta_leaves_the_others():
    zoo = make_zoo()
    before = [run(m, kind) for m, (kind, _) in zip(zoo, ZOO)]
    zoo[1].to("meta")
    assert all(t.is_meta for t in list(zoo[1].parameters()) + list(zoo[1].buffers()))
    assert_as_before(zoo, before, skip={1})


def test_deepcopy_is_a_separate_model():
    zoo = make_zoo()
    before = [run(m, kind) for m, (kind, _) in zip(zoo, ZOO)]
    twin = copy.deepcopy(zoo[0])
    for out, old in zip(run(twin, "backbone"), before[0]):
        torch.testing.assert_close(out, old, rtol=0, atol=0)
    twin.double()
    zoo[0].half()
    assert_as_before(zoo, before, skip={0})
    assert_close_to(run(twin, "backbone"), before[0], 1e-5)
    assert_close_to(run(zoo[0], "backbone"), before[0], 2e-2)


def test_loading_a_state_dict_into_one_model_leaves_the_others():
    """load_state_dict copies into the existing tensors; a tensor shared with another model would
    change there too (the doubled basis stands for a checkpoint whose numbers differ)."""
    zoo = make_zoo()
    before = [run(m, kind) for m, (kind, _) in zip(zoo, ZOO)]
    state = {k: v * 2 if k.endswith("sampled_basis") else v for k, v in zoo[2].state_dict().items()}
    zoo[2].load_state_dict(state)
    assert_as_before(zoo, before, skip={2})
    assert not torch.allclose(run(zoo[2], "neck")[0], before[2][0])


@pytest.mark.cuda
@pytest.mark.parametrize("target,rtol", [(0, 1e-2), (1, 1e-10)],  # float32 convs may use TF32
                         ids=["float_backbone", "double_backbone"])
def test_moving_one_model_to_cuda_and_back_leaves_the_others(target, rtol):
    zoo = make_zoo()
    before = [run(m, kind) for m, (kind, _) in zip(zoo, ZOO)]
    zoo[target].cuda()
    assert_as_before(zoo, before, skip={target})
    outs = run(zoo[target], ZOO[target][0])
    assert all(o.is_cuda and o.dtype == ZOO[target][1] for o in outs)
    assert_close_to(outs, before[target], rtol)
    zoo[target].cpu()
    assert_as_before(zoo, before)


def test_owned_bases_compare_and_hash_by_identity():
    """e2cnn's == and hash of a block basis compare tensors and hash its whole description, and
    torch hashes every module on each modules()/parameters() walk (which would make every walk
    of ReResNet-50 slow). A basis owned by one conv is equal only to itself."""
    from e2cnn.nn.modules.r2_conv import SingleBlockBasisExpansion
    a, b = build("backbone", torch.float32, 0), build("backbone", torch.float32, 0)
    blocks_a = [m for m in a.modules() if isinstance(m, SingleBlockBasisExpansion)]
    blocks_b = [m for m in b.modules() if isinstance(m, SingleBlockBasisExpansion)]
    assert blocks_a and len(blocks_a) == len(blocks_b)
    for x, y in zip(blocks_a, blocks_b):
        assert x == x and x != y  # (e2cnn's == holds: same basis, same sampled numbers)
        assert hash(x) == object.__hash__(x)


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_owned_bases_under_autocast_give_e2cnns_expansion_and_cast_once(amp_dtype):
    """Under autocast an owned basis is cast to the autocast dtype once and kept (e2cnn's einsum
    casts it in every call): the same filters, bit for bit; a converted basis is cast again."""
    from e2cnn.nn.modules.r2_conv import SingleBlockBasisExpansion
    model = build("backbone", torch.float32, 0).train()
    blocks = [m for m in model.modules() if isinstance(m, SingleBlockBasisExpansion)]
    weights = [torch.randn(1, m.dimension()) for m in blocks]
    with torch.autocast("cpu", dtype=amp_dtype):
        for block, w in zip(blocks, weights):
            ours, again = block(w), block(w)
            theirs = SingleBlockBasisExpansion.forward(block, w)
            assert ours.dtype == amp_dtype and torch.equal(ours, theirs) and torch.equal(again, ours)
        kept = blocks[0]._basis_as(amp_dtype)
        assert blocks[0]._basis_as(amp_dtype) is kept
        model.double().float()  # (a new basis tensor)
        assert blocks[0]._basis_as(amp_dtype) is not kept
        torch.testing.assert_close(blocks[0](weights[0]),
                                   SingleBlockBasisExpansion.forward(blocks[0], weights[0]),
                                   rtol=0, atol=0)
    assert torch.equal(blocks[0](weights[0]), SingleBlockBasisExpansion.forward(blocks[0], weights[0]))
