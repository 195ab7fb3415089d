"""ReResNet: shapes, channel layout / rotation equivariance, export to plain PyTorch, training modes."""
import pytest
import torch
from e2cnn import nn as enn
from e2cnn.nn.init import _generalized_he_init_variances
from mmdet.registry import MODELS
from mmengine.runner.checkpoint import load_state_dict as mmengine_load_state_dict
from torch.nn.modules.batchnorm import _BatchNorm

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.layers.equivariant import (convert_to_plain, he_init_, r2conv,
                                                    regular_type, trivial_type)
from redet_plugin.models.layers.field_batch_norm import FieldBatchNorm
from tests._helpers import full_fp32

TINY = dict(depth=18, base_channels=16)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def cycle_orientations(f, steps, n=8):
    """Channel field*n + o of the result holds channel field*n + (o - steps) mod n of `f`."""
    b, c, h, w = f.shape
    return f.reshape(b, c // n, n, h, w).roll(steps, dims=2).reshape(b, c, h, w)


def randomize_norms(model):
    """Non-trivial affine params and running stats, so the export and load checks see them."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = ReResNet(**TINY)
    randomize_norms(model)
    return model.eval()


def test_tiny_shapes_and_channels(tiny):
    outs = tiny(torch.randn(2, 3, 64, 48))
    assert tiny.out_channels == [16, 32, 64, 128]
    assert [tuple(o.shape) for o in outs] == [(2, 16, 16, 12), (2, 32, 8, 6), (2, 64, 4, 3), (2, 128, 2, 2)]
    assert all(type(o) is torch.Tensor for o in outs)


def test_training_step_reads_nothing_back_from_the_device():
    """A training forward and backward never reads a value back to the host (on a GPU: never
    waits for the device). On the meta device any such read raises."""
    model = ReResNet(**TINY).to("meta").train()
    outs = model(torch.empty(2, 3, 64, 48, device="meta"))
    sum(o.sum() for o in outs).backward()
    assert [tuple(o.shape) for o in outs] == [(2, 16, 16, 12), (2, 32, 8, 6), (2, 64, 4, 3), (2, 128, 2, 2)]
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_resnet50_full_width_shapes():
    model = MODELS.build(dict(type="RedetReResNet", depth=50, out_indices=(0, 1, 2, 3)))
    assert model.out_channels == [256, 512, 1024, 2048]
    with torch.no_grad():
        outs = model.eval()(torch.randn(1, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == [(1, 256, 8, 8), (1, 512, 4, 4), (1, 1024, 2, 2),
                                              (1, 2048, 1, 1)]


def test_out_indices_and_num_stages():
    model = ReResNet(depth=34, base_channels=8, num_stages=3, out_indices=(1, 2)).eval()
    outs = model(torch.randn(1, 3, 32, 32))
    assert model.out_channels == [16, 32]
    assert [tuple(o.shape) for o in outs] == [(1, 16, 4, 4), (1, 32, 2, 2)]


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_rotation_by_90_degrees_cycles_orientations_by_two(tiny, mode):
    """torch.rot90(k=1) (counter-clockwise on screen, y down) rotates every feature map the same
    way and moves orientation o to o + 2: 90 degrees = 2 steps of C8. Odd sizes (33 -> 17 -> 9 ->
    5 -> 3 -> 2) keep the strided sampling grid symmetric, so the equality is exact."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 33, 33)
    tiny.train(mode == "train")
    try:
        with torch.no_grad():
            feats, feats_rot = tiny(x), tiny(torch.rot90(x, 1, (2, 3)))
    finally:
        tiny.eval()
    for f, f_rot in zip(feats, feats_rot):
        expected = cycle_orientations(torch.rot90(f, 1, (2, 3)), 2)
        assert rel_err(f_rot, expected) < 1e-4
        # the other direction is wrong: the test can tell them apart
        assert rel_err(f_rot, cycle_orientations(torch.rot90(f, 1, (2, 3)), -2)) > 0.1


def test_even_sizes_break_exact_equivariance(tiny):
    # documents a limit of strided CNNs: with even sizes the stride-2 grid is not symmetric
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        f, f_rot = tiny(x)[-1], tiny(torch.rot90(x, 1, (2, 3)))[-1]
    assert rel_err(f_rot, cycle_orientations(torch.rot90(f, 1, (2, 3)), 2)) > 1e-2


@pytest.mark.parametrize("in_type,kernel_size", [("regular", 3), ("regular", 1), ("trivial", 7)])
def test_fast_he_init_matches_e2cnn(in_type, kernel_size):
    src = regular_type(24) if in_type == "regular" else trivial_type(3)
    conv = r2conv(src, regular_type(16), kernel_size)
    expected_std = _generalized_he_init_variances(conv.basisexpansion)
    torch.manual_seed(0)
    he_init_(conv)
    torch.manual_seed(0)
    assert torch.allclose(conv.weights, expected_std * torch.randn_like(expected_std), rtol=1e-6)


def test_export_gives_the_same_outputs():
    torch.manual_seed(0)
    model = ReResNet(**TINY)
    randomize_norms(model)
    model.eval()
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        before = model(x)
        convert_to_plain(model)
        after = model(x)
    assert model.exported and not model.training
    assert not any(isinstance(m, enn.EquivariantModule) for m in model.modules())
    assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    for a, b in zip(after, before):
        assert rel_err(a, b) < 1e-5


def test_train_forward_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = ReResNet(**TINY).train()
    outs = model(torch.randn(2, 3, 64, 64))
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_norm_eval_keeps_running_stats():
    model = ReResNet(**TINY, norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and all(not m.training for m in bns)
    stats = [m.running_mean.clone() for m in bns]
    model(torch.randn(2, 3, 32, 32))
    assert all(torch.equal(s, m.running_mean) for s, m in zip(stats, bns))
    model_default = ReResNet(**TINY).train()
    assert all(m.training for m in model_default.modules() if isinstance(m, _BatchNorm))


def test_frozen_stages():
    model = ReResNet(**TINY, frozen_stages=1).train()
    frozen = [model.conv1, model.bn1, model.layer1]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for f in frozen for m in f.modules())
    assert all(p.requires_grad for p in model.layer2.parameters()) and model.layer2.training
    outs = model(torch.randn(1, 3, 32, 32))
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is None for m in frozen for p in m.parameters())
    assert all(p.grad is not None for p in model.layer2.parameters())


@pytest.mark.parametrize("loader", ["torch", "mmengine"])
def test_state_dict_independent_of_mode_and_loads_into_eval_model(loader):
    torch.manual_seed(0)
    src = ReResNet(**TINY)
    randomize_norms(src)
    train_keys = set(src.state_dict())
    src.eval()
    assert set(src.state_dict()) == train_keys  # e2cnn's filter cache stays out of checkpoints
    assert not any(k.endswith(".filter") for k in train_keys)
    # eval-mode convs (here: all; in training: the frozen stages) cache filters of their own
    # random weights; loading must rebuild them
    dst = ReResNet(**TINY, frozen_stages=1).eval()
    if loader == "torch":
        dst.load_state_dict(src.state_dict(), strict=True)
    else:  # the path of init_cfg=Pretrained, load_from and resume
        mmengine_load_state_dict(dst, src.state_dict(), strict=True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(dst(x), src(x)))


def test_zero_init_residual():
    model = ReResNet(**TINY)
    model.init_weights()
    for block in list(model.layer1) + list(model.layer4):
        weights = [m.weight for m in block.bn2.modules() if isinstance(m, _BatchNorm)]
        assert weights and all(torch.all(w == 0) for w in weights)
    assert all(torch.all(m.weight == 1) for m in model.bn1.modules() if isinstance(m, _BatchNorm))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(depth=20), KeyError, "depth must be one of"),
    (dict(depth=18, base_channels=12), ValueError, "multiple of num_orientations=8"),
    (dict(depth=18, stem_channels=20), ValueError, "stem_channels must be a positive multiple"),
    (dict(depth=18, out_indices=(4,)), ValueError, "out_indices must lie in"),
    (dict(depth=18, style="tf"), ValueError, "style must be"),
    (dict(depth=18, frozen_stages=5), ValueError, "frozen_stages must be in"),
    (dict(depth=18, pretrained="a.pth", init_cfg=dict(type="Pretrained", checkpoint="a.pth")),
     ValueError, "either pretrained or init_cfg"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ReResNet(**kwargs)


def test_bad_input(tiny):
    with pytest.raises(ValueError, match=r"x must be a \(N, 3, H, W\) tensor; got \(1, 4, 8, 8\)"):
        tiny(torch.randn(1, 4, 8, 8))


@pytest.mark.cuda
def test_cuda_export_stays_on_the_device_and_matches():
    torch.manual_seed(0)
    model = ReResNet(**TINY)
    randomize_norms(model)
    model = model.cuda().eval()
    x = torch.randn(2, 3, 33, 33, device="cuda")
    with torch.no_grad(), full_fp32():  # equivariance to 1e-4 needs fp32, not TF32, convolutions
        before, rotated = model(x), model(torch.rot90(x, 1, (2, 3)))
        after = model.export()(x)
    assert all(p.is_cuda for p in model.parameters()) and all(b.is_cuda for b in model.buffers())
    for a, b, r in zip(after, before, rotated):
        assert a.is_cuda and rel_err(a, b) < 1e-5
        assert rel_err(r, cycle_orientations(torch.rot90(b, 1, (2, 3)), 2)) < 1e-4


def test_mmengine_revert_sync_batchnorm_keeps_every_module_quietly(monkeypatch):
    """The Runner calls revert_sync_batchnorm on every model; it re-adds each child by name, which
    e2cnn's SequentialModule (the downsample paths) refused with a warning per module."""
    import mmengine.model.utils as mm_utils
    warnings = []
    monkeypatch.setattr(mm_utils, "print_log", lambda msg, *a, **k: warnings.append(msg))
    model = ReResNet(**TINY).eval()
    x = torch.randn(1, 3, 33, 33)
    before = model(x)
    reverted = mm_utils.revert_sync_batchnorm(model)
    assert warnings == []
    assert [name for name, _ in reverted.named_modules()] == [name for name, _ in model.named_modules()]
    for a, b in zip(reverted(x), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_downsample_replacement_must_keep_field_types():
    model = ReResNet(**TINY)
    downsample = model.layer2[0].downsample
    same = regular_type(downsample.get_submodule("0").out_type.size)
    downsample.add_module("1", FieldBatchNorm(same))  # (a new norm of the same fields: fine)
    with pytest.raises(ValueError, match="module '0' can only be replaced by one with the same field types"):
        downsample.add_module("0", r2conv(same, same, 1))


def test_convert_sync_batchnorm_reaches_the_downsample_norms():
    """mmengine's sync_bn='torch' converts with torch's convert_sync_batchnorm, which also re-adds
    every child by name (e2cnn's SequentialModule raised a bare AssertionError)."""
    model = ReResNet(**TINY)
    norms = [name for name, m in model.named_modules() if type(m) is torch.nn.BatchNorm3d]
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    synced = [name for name, m in converted.named_modules() if isinstance(m, torch.nn.SyncBatchNorm)]
    assert synced == norms and any(".downsample." in name for name in synced)


def test_model_train_keeps_the_filters_of_frozen_stages():
    """mmengine's loops call model.train() every iteration: frozen convs (straight back in eval)
    keep their expanded filter, the same tensor, instead of expanding it again each time."""
    model = ReResNet(**TINY, frozen_stages=1).train()
    frozen, trainable = model.conv1, model.layer2[0].conv1
    cached = frozen.filter
    model.train()
    model.train()
    assert frozen.filter is cached and not frozen.training
    torch.testing.assert_close(cached, frozen.expand_parameters()[0], rtol=0, atol=0)
    assert "filter" not in vars(trainable)  # (trainable convs hold no dense copy in training)


def test_eval_expands_again_after_a_write_through_data():
    """mmdet's MeanTeacherHook and mmengine's EMA write frozen weights through `.data`, which torch
    does not count as a change: the teacher's filters must still follow its weights."""
    student = ReResNet(**TINY).eval()
    teacher = ReResNet(**TINY).requires_grad_(False).eval()
    for mine, theirs in zip(teacher.parameters(), student.parameters()):
        mine.data.copy_(theirs.data)
    teacher.train()
    teacher.eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(teacher(x), student(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ema_copies_keep_working_after_evaluation():
    """The eval-mode filters are not buffers: mmengine's EMA pairs the copy's buffers with the
    model's by position, and a mode-dependent list misaligned them."""
    from mmengine.model import ExponentialMovingAverage
    model = ReResNet(**TINY)
    ema = ExponentialMovingAverage(model, momentum=0.5)
    ema.eval()
    with torch.no_grad():
        ema(torch.randn(1, 3, 64, 64))
    ema.train()
    assert len(list(ema.module.buffers())) == len(list(model.buffers()))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1)
    ema.update_parameters(model)
    conv = ema.module.conv1
    conv.eval()
    torch.testing.assert_close(conv.filter, conv.expand_parameters()[0], rtol=0, atol=0)


def test_the_eval_filter_moves_and_converts_with_the_module():
    conv = r2conv(regular_type(16), regular_type(16), 3, padding=1).eval()
    conv.double()
    assert conv.filter.dtype == torch.float64 and "filter" not in dict(conv.named_buffers())
    x = enn.GeometricTensor(torch.randn(1, 16, 9, 9, dtype=torch.float64), conv.in_type)
    torch.testing.assert_close(conv(x).tensor, conv.train()(x).tensor)


def test_eval_expands_again_after_the_weights_changed_in_place():
    conv = r2conv(regular_type(16), regular_type(16), 3, padding=1).eval()
    stale = conv.filter
    with torch.no_grad():
        conv.weights.mul_(2)
    conv.eval()
    assert conv.filter is not stale
    torch.testing.assert_close(conv.filter, 2 * stale)
    x = enn.GeometricTensor(torch.randn(1, 16, 9, 9), conv.in_type)
    torch.testing.assert_close(conv(x).tensor, conv.train()(x).tensor)  # eval's filter = training's
