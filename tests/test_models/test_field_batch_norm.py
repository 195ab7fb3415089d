"""FieldBatchNorm against e2cnn's InnerBatchNorm: outputs, gradients, running statistics, state_dict,
settings, low precision, and ReResNet's frozen stages and norm_eval."""
import copy

import pytest
import torch
from e2cnn import nn as enn
from torch.autograd import gradcheck
from torch.nn.modules.batchnorm import _BatchNorm

from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.layers.equivariant import regular_type, rotation_gspace
from redet_plugin.testing import capture, waits_for_nothing
from redet_plugin.models.layers import field_batch_norm as field_batch_norm_module
from redet_plugin.models.layers.field_batch_norm import (FieldBatchNorm, _BatchStatisticsNorm,
                                                         _FieldScaleShift, field_batch_norm)

USES_FIELD_NORM = FieldBatchNorm.uses_field_norm  # the real rule, before the fixture below


@pytest.fixture(autouse=True)
def field_norm_everywhere(monkeypatch):
    """By default field_batch_norm runs only on CUDA and channels-last maps; in these tests on
    every input (test_dispatch_rule checks the real rule)."""
    monkeypatch.setattr(FieldBatchNorm, "uses_field_norm", lambda self, x: True)


class _Shape:
    def __init__(self, shape, is_cuda, channels_last=False):
        self.shape, self.is_cuda, self.channels_last = shape, is_cuda, channels_last

    def is_contiguous(self, memory_format=torch.contiguous_format):
        return (memory_format == torch.channels_last) == self.channels_last


@pytest.mark.parametrize("kind", ["regular", "mixed"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("rule", ["field_norm", "real_rule"])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last],
                         ids=["nchw", "nhwc"])
def test_forward_reads_nothing_back_from_the_device(kind, training, rule, layout, monkeypatch):
    """e2cnn's InnerBatchNorm slices contiguous fields with the elements of its index buffer, a read
    back from the device (on a GPU a synchronisation) per slice; ours reads nothing back. On the
    meta device any such read raises."""
    if rule == "real_rule":  # not CUDA: torch's batch norm per field size
        monkeypatch.setattr(FieldBatchNorm, "uses_field_norm", USES_FIELD_NORM)
    _, ours = make_pair(kind, dtype=torch.float32)
    ours.to("meta").train(training)
    x = torch.empty(2, ours.in_type.size, 5, 7, device="meta").contiguous(memory_format=layout)
    x.requires_grad_()
    y = ours(enn.GeometricTensor(x, ours.in_type)).tensor
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    if kind == "regular":  # contiguous fields: e2cnn's own forward does read back
        ref = enn.InnerBatchNorm(ours.in_type).to("meta").train(training)
        with pytest.raises(RuntimeError, match="item"):
            ref(enn.GeometricTensor(x, ref.in_type))


def test_dispatch_rule():
    module = FieldBatchNorm(regular_type(256))  # 32 fields of 8 channels
    for training in (True, False):
        module.train(training)
        assert USES_FIELD_NORM(module, _Shape((2, 256, 8, 8), True))  # CUDA: any size, any mode
        assert not USES_FIELD_NORM(module, _Shape((2, 256, 512, 512), False))  # CPU: torch's own
        # channels-last: e2cnn's (B, fields, s, H, W) view would be a copy
        assert USES_FIELD_NORM(module, _Shape((2, 256, 8, 8), False, channels_last=True))


def test_e2cnn_path_on_cpu_nchw_maps(monkeypatch):
    monkeypatch.setattr(FieldBatchNorm, "uses_field_norm", USES_FIELD_NORM)
    ref, ours = make_pair(dtype=torch.float32)
    x = random_input(ours.in_type, dtype=torch.float32)
    grad = torch.randn_like(x)
    assert_all_close(run(ours, x, grad), run(ref, x, grad), rtol=0, atol=0)
    assert_all_close(state(ours), state(ref), rtol=0, atol=0)


def field_type(kind):
    if kind == "regular":
        return regular_type(32)
    gspace = rotation_gspace()
    reg, triv = gspace.regular_repr, gspace.trivial_repr
    # two field sizes, the regular fields not contiguous: e2cnn's indexing path
    return enn.FieldType(gspace, [reg, triv, reg, triv, triv, reg])


def inner_norms(module):
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


def make_pair(kind="regular", dtype=torch.float64, **kwargs):
    """e2cnn's module and ours with the same (random, non-trivial) parameters and buffers."""
    ftype = field_type(kind)
    ref = enn.InnerBatchNorm(ftype, **kwargs).to(dtype)
    with torch.no_grad():
        for bn in inner_norms(ref):
            if bn.affine:
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
            if bn.track_running_stats:
                bn.running_mean.uniform_(-0.3, 0.3)
                bn.running_var.uniform_(0.5, 1.5)
    ours = FieldBatchNorm(ftype, **kwargs).to(dtype)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def run(module, x, grad):
    """Output, input gradient and parameter gradients of one forward and backward."""
    x = x.detach().clone().requires_grad_()
    y = module(enn.GeometricTensor(x, module.in_type)).tensor
    y.backward(grad)
    params = [p.grad.clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return [y.detach(), x.grad] + params


def state(module):
    return [t.clone() for t in module.state_dict().values()]


def assert_all_close(actual, expected, **tol):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, **tol)


def random_input(ftype, batch=2, h=5, w=7, dtype=torch.float64, scale=3.0, offset=1.0):
    return torch.randn(batch, ftype.size, h, w, dtype=dtype) * scale + offset


SETTINGS = [dict(), dict(momentum=None), dict(affine=False), dict(track_running_stats=False),
            dict(eps=1e-3, momentum=0.3)]


class SyncBatchNormKernelsOnCpu:
    """torch's CUDA-only SyncBatchNorm kernels as their CUDA sources define them, written with CPU
    ops: FieldBatchNorm's use of them (fields' channels as processes, per-channel copies of the
    field statistics) is then checked against e2cnn here; test_cuda_* run the real kernels."""

    @staticmethod
    def _dims(x):
        return (0,) + tuple(range(2, x.dim()))

    @staticmethod
    def _c(v, x):  # (C,) broadcast against (B, C, *spatial)
        return v.view((-1,) + (1,) * (x.dim() - 2))

    def batch_norm_stats(self, x, eps):
        var, mean = torch.var_mean(x, self._dims(x), correction=0)
        return mean, (var + eps).rsqrt()

    def batch_norm_gather_stats_with_counts(self, _input, mean, invstd, running_mean, running_var,
                                            momentum, eps, counts):
        counts = counts[:mean.shape[0], None].to(mean.dtype)
        n = counts.sum()
        avg = (counts * mean).sum(0) / n
        var_n = (counts * (invstd.pow(-2) - eps + (mean - avg).square())).sum(0)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(momentum * avg)
            running_var.mul_(1 - momentum).add_(momentum * var_n / (n - 1))
        return avg, (var_n / n + eps).rsqrt()

    def batch_norm_elemt(self, x, weight, bias, mean, invstd, _eps):
        out = (x - self._c(mean, x)) * self._c(invstd, x)
        out = out if weight is None else out * self._c(weight, x)
        return out if bias is None else out + self._c(bias, x)

    def batch_norm_backward_reduce(self, grad, x, mean, invstd, weight, input_g, weight_g, bias_g):
        sum_dy = grad.sum(self._dims(x))
        sum_dy_xmu = (grad * (x - self._c(mean, x))).sum(self._dims(x))
        return (sum_dy if input_g else None, sum_dy_xmu if input_g else None,
                sum_dy_xmu * invstd if weight_g else None, sum_dy if bias_g else None)

    def batch_norm_backward_elemt(self, grad, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
        assert count.dtype == torch.int32
        n = count.sum()
        c = lambda v: self._c(v, x)  # noqa: E731
        out = (grad - c(sum_dy) / n - (x - c(mean)) * c(invstd).square() * c(sum_dy_xmu) / n)
        return out * c(invstd) * (1 if weight is None else c(weight))


@pytest.fixture
def sync_kernels_on_cpu(monkeypatch):
    kernels = SyncBatchNormKernelsOnCpu()
    for name in ("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
                 "batch_norm_backward_reduce", "batch_norm_backward_elemt"):
        monkeypatch.setattr(torch, name, getattr(kernels, name))
    monkeypatch.setattr(field_batch_norm_module, "_sync_batch_norm_kernels_serve",
                        lambda x, bn: True)


@pytest.fixture(params=["reductions", "sync_kernels"])
def field_norm_path(request):
    """CPU: the reductions (what the CPU runs), and the CUDA path with its kernels emulated."""
    if request.param == "sync_kernels":
        request.getfixturevalue("sync_kernels_on_cpu")
    return request.param


@pytest.mark.parametrize("kind", ["regular", "mixed"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
                         or "default")
@pytest.mark.parametrize("mode", ["train", "eval", "norm_eval"])
def test_matches_e2cnn(kind, settings, mode, field_norm_path):
    """Several steps: outputs, input and parameter gradients, then running statistics and
    num_batches_tracked. norm_eval: the module trains but its BatchNorms are in eval mode, as
    ReResNet(norm_eval=True) sets them."""
    torch.manual_seed(0)
    ref, ours = make_pair(kind, **settings)
    for m in (ref, ours):
        m.train(mode != "eval")
        if mode == "norm_eval":
            for bn in inner_norms(m):
                bn.eval()
    before = state(ours)
    for step in range(3):
        x = random_input(ours.in_type, batch=2 + step)
        grad = torch.randn_like(x)
        assert_all_close(run(ours, x, grad), run(ref, x, grad), rtol=1e-10, atol=1e-10)
        assert_all_close(state(ours), state(ref), rtol=1e-12, atol=1e-12)
    updates = mode == "train" and settings.get("track_running_stats", True)
    assert all(bn.num_batches_tracked.item() == 3 * updates for bn in inner_norms(ours)
               if bn.track_running_stats)
    changed = [not torch.equal(a, b) for a, b in zip(state(ours), before)]
    assert any(changed) == updates


@pytest.mark.parametrize("kind", ["regular", "mixed"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_torch_norm_path_is_e2cnn_bit_for_bit(kind, mode, monkeypatch):
    """The real rule on the CPU: the inner BatchNorm3d called on the same (B, fields, s, H, W)
    views as e2cnn's forward, so outputs, gradients and running statistics are identical."""
    monkeypatch.setattr(FieldBatchNorm, "uses_field_norm", USES_FIELD_NORM)
    torch.manual_seed(0)
    ref, ours = make_pair(kind)
    ref.train(mode == "train"), ours.train(mode == "train")
    for step in range(2):
        x = random_input(ours.in_type, batch=2 + step)
        grad = torch.randn_like(x)
        assert_all_close(run(ours, x, grad), run(ref, x, grad), rtol=0, atol=0)
        assert_all_close(state(ours), state(ref), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["regular", "mixed"])
def test_channels_last_input_gives_the_same_results_in_its_layout(kind, field_norm_path):
    torch.manual_seed(0)
    _, ours = make_pair(kind)
    twin = copy.deepcopy(ours)
    x = random_input(ours.in_type, batch=3, h=6, w=5)
    grad = torch.randn_like(x)
    last = torch.channels_last
    for mode in (True, False):
        ours.train(mode), twin.train(mode)
        expected = run(ours, x, grad)
        out = run(twin, x.contiguous(memory_format=last), grad.contiguous(memory_format=last))
        assert out[0].is_contiguous(memory_format=last) and out[1].is_contiguous(memory_format=last)
        assert_all_close(out, expected, rtol=1e-12, atol=1e-12)
        assert_all_close(state(twin), state(ours), rtol=1e-12, atol=1e-12)


def test_float32_matches_e2cnn_closely():
    torch.manual_seed(0)
    ref, ours = make_pair(dtype=torch.float32)
    x = random_input(ours.in_type, batch=2, h=16, w=16, dtype=torch.float32)
    grad = torch.randn_like(x)
    for mode in (True, False):
        ref.train(mode), ours.train(mode)
        assert_all_close(run(ours, x, grad), run(ref, x, grad), rtol=1e-5, atol=1e-5)
        assert_all_close(state(ours), state(ref), rtol=1e-6, atol=1e-6)


def test_statistics_are_per_field():
    """Each field (8 orientation channels) is normalised as one group: zero mean and unit
    (biased) variance over batch, its channels and space, whatever the per-channel offsets."""
    torch.manual_seed(0)
    ftype = regular_type(16)
    module = FieldBatchNorm(ftype, affine=False).double().train()
    x = random_input(ftype, batch=3, h=4, w=6) + torch.arange(16.0, dtype=torch.float64)[:, None, None]
    y = module(enn.GeometricTensor(x, ftype)).tensor.reshape(3, 2, 8 * 4 * 6)
    torch.testing.assert_close(y.mean(dim=(0, 2)), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(dim=(0, 2), correction=0), torch.ones(2, dtype=torch.float64),
                               atol=1e-4, rtol=0)  # eps
    channel_means = y.reshape(3, 16, -1).mean(dim=(0, 2))
    assert channel_means.std() > 0.1  # a per-channel norm would zero these


def test_gradcheck_batch_statistics():
    torch.manual_seed(0)
    # 4 fields of 2 channels
    x = (torch.randn(3, 8, 2, 5, dtype=torch.float64) * 2 + 1).requires_grad_()
    weight = torch.rand(4, dtype=torch.float64).add_(0.5).requires_grad_()
    bias = torch.randn(4, dtype=torch.float64).requires_grad_()
    assert gradcheck(lambda *a: _BatchStatisticsNorm.apply(*a, 1e-5, 2)[0], (x, weight, bias))
    assert gradcheck(lambda a: _BatchStatisticsNorm.apply(a, None, None, 1e-5, 2)[0], (x,))
    # only some inputs need gradients
    assert gradcheck(lambda a, w: _BatchStatisticsNorm.apply(a, w, bias.detach(), 1e-5, 2)[0],
                     (x.detach(), weight))


def test_gradcheck_sync_batch_norm_kernels(sync_kernels_on_cpu):
    torch.manual_seed(0)
    x = (torch.randn(3, 8, 2, 5, dtype=torch.float64) * 2 + 1).requires_grad_()  # 4 fields of 2
    weight = torch.rand(4, dtype=torch.float64).add_(0.5).requires_grad_()
    bias = torch.randn(4, dtype=torch.float64).requires_grad_()
    apply = field_batch_norm_module._SyncBatchNormKernels.apply
    assert gradcheck(lambda *a: apply(*a, 1e-5, 2, None, None, 0.1), (x, weight, bias))
    assert gradcheck(lambda a: apply(a, None, None, 1e-5, 2, None, None, 0.1), (x,))
    assert gradcheck(lambda a, w: apply(a, w, bias.detach(), 1e-5, 2, None, None, 0.1),
                     (x.detach(), weight))


def test_sync_batch_norm_kernels_serve_cuda_with_statistics_dtype_parameters():
    serve = field_batch_norm_module._sync_batch_norm_kernels_serve
    bn = torch.nn.BatchNorm3d(4)

    class Input:
        def __init__(self, dtype, is_cuda=True, elements_per_field=2**20):
            self.dtype, self.is_cuda = dtype, is_cuda
            self._numel = elements_per_field * bn.num_features

        def numel(self):
            return self._numel

    assert serve(Input(torch.float32), bn)
    assert serve(Input(torch.float16), bn) and serve(Input(torch.bfloat16), bn)  # float32 stats
    assert not serve(Input(torch.float32, is_cuda=False), bn)  # the kernels are CUDA-only
    assert not serve(Input(torch.float64), bn)
    assert serve(Input(torch.float64), torch.nn.BatchNorm3d(4).double())
    # bf16 buffers: the kernels would round their per-channel counts to bf16
    assert not serve(Input(torch.bfloat16), torch.nn.BatchNorm3d(4).bfloat16())
    assert serve(Input(torch.float32), torch.nn.BatchNorm3d(4, affine=False,
                                                             track_running_stats=False))
    # the input gradient's kernel counts a field's elements in an int32
    assert serve(Input(torch.float32, elements_per_field=2**31 - 1), bn)
    assert not serve(Input(torch.float32, elements_per_field=2**31), bn)


def test_gradcheck_scale_shift_and_eval_module():
    torch.manual_seed(0)
    x = torch.randn(3, 8, 2, 5, dtype=torch.float64, requires_grad=True)  # 4 fields of 2
    scale = torch.randn(4, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda *a: _FieldScaleShift.apply(*a, 2), (x, scale, shift))
    # through the module in eval mode: gradients reach x, weight and bias
    _, ours = make_pair()
    ours.eval()
    xg = random_input(ours.in_type, h=3, w=2).requires_grad_()
    assert gradcheck(lambda a: ours(enn.GeometricTensor(a, ours.in_type)).tensor, (xg,))


def test_zero_weight_gives_zero_input_gradient():
    """zero_init_residual sets some weights to 0: the input gradient must be exactly 0 there."""
    _, ours = make_pair()
    with torch.no_grad():
        inner_norms(ours)[0].weight[1] = 0
    x = random_input(ours.in_type)
    _, grad_x, grad_w, _ = run(ours.train(), x, torch.randn_like(x))
    assert torch.all(grad_x[:, 8:16] == 0) and grad_x[:, :8].abs().sum() > 0
    assert grad_w[1] != 0


def test_state_dict_identical_and_loads_both_ways():
    torch.manual_seed(0)
    ref, ours = make_pair("mixed")
    ref_state, our_state = ref.state_dict(), FieldBatchNorm(ref.in_type).double().state_dict()
    assert list(ref_state) == list(our_state)
    assert all(ref_state[k].shape == our_state[k].shape and ref_state[k].dtype == our_state[k].dtype
               for k in ref_state)
    # train ours a few steps, then load ours into a fresh e2cnn module and back
    for _ in range(2):
        x = random_input(ours.in_type)
        run(ours, x, torch.randn_like(x))
    fresh_ref = enn.InnerBatchNorm(ref.in_type).double()
    fresh_ref.load_state_dict(ours.state_dict(), strict=True)
    fresh_ours = FieldBatchNorm(ref.in_type).double()
    fresh_ours.load_state_dict(fresh_ref.state_dict(), strict=True)
    assert_all_close(state(fresh_ours), state(ours), rtol=0, atol=0)
    x = random_input(ours.in_type)
    for m in (ours, fresh_ref, fresh_ours):
        m.eval()
    expected = ours(enn.GeometricTensor(x, ours.in_type)).tensor
    for m in (fresh_ref, fresh_ours):
        torch.testing.assert_close(m(enn.GeometricTensor(x, m.in_type)).tensor, expected,
                                   rtol=1e-12, atol=1e-12)


def test_is_an_inner_batch_norm_and_exports_like_it():
    _, ours = make_pair(dtype=torch.float32)
    assert isinstance(ours, enn.InnerBatchNorm)
    assert all(type(m) is torch.nn.BatchNorm3d for m in inner_norms(ours))
    x = random_input(ours.in_type, dtype=torch.float32)
    expected = ours.eval()(enn.GeometricTensor(x, ours.in_type)).tensor
    plain = ours.export()
    assert isinstance(plain, torch.nn.BatchNorm2d)
    torch.testing.assert_close(plain(x), expected, rtol=1e-6, atol=1e-6)


def test_other_inner_norms_are_called_as_e2cnn_calls_them():
    """e.g. after SyncBatchNorm conversion the inner module must run itself (it syncs statistics)."""
    calls = []

    class RecordingBatchNorm3d(torch.nn.BatchNorm3d):
        def forward(self, x):
            calls.append(x.shape)
            return super().forward(x)

    ref, ours = make_pair(dtype=torch.float32)
    setattr(ours, "batch_norm_[8]", RecordingBatchNorm3d(4).float())
    getattr(ours, "batch_norm_[8]").load_state_dict(getattr(ref, "batch_norm_[8]").state_dict())
    x = random_input(ours.in_type, dtype=torch.float32)
    torch.testing.assert_close(ours(enn.GeometricTensor(x, ours.in_type)).tensor,
                               ref(enn.GeometricTensor(x, ref.in_type)).tensor)
    assert calls == [(2, 4, 8, 5, 7)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
def test_low_precision_input(dtype, autocast):
    """fp32 statistics and sums, output and input gradient in the input's dtype, float32
    parameters, buffers and their gradients: compared with the float64 result for the same
    (exactly representable) input and output gradient."""
    torch.manual_seed(0)
    ref, ours = make_pair(dtype=torch.float32)
    exact = copy.deepcopy(ours).double()
    x = random_input(ours.in_type, h=8, w=8, dtype=dtype)
    grad = torch.randn_like(x)
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        out = run(ours, x, grad)
    expected = run(exact, x.double(), grad.double())
    assert out[0].dtype == dtype and out[1].dtype == dtype
    assert all(o.dtype == torch.float32 for o in out[2:] + state(ours)[1:5])
    ulp = torch.finfo(dtype).eps
    for o, e in zip(out[:2], expected[:2]):
        assert ((o.double() - e).abs() <= ulp * e.abs().max()).all()
    assert_all_close([o.double() for o in out[2:]], expected[2:], rtol=1e-5, atol=1e-4)
    assert_all_close([s.double() for s in state(ours)[1:5]], state(exact)[1:5], rtol=1e-5, atol=1e-6)


def test_bad_input():
    _, ours = make_pair()
    with pytest.raises(TypeError, match="input must be a GeometricTensor of type"):
        ours(torch.randn(2, 32, 3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="input must be a GeometricTensor of type"):
        ours(enn.GeometricTensor(torch.randn(2, 16, 3, 3), regular_type(16)))
    with pytest.raises(ValueError, match=r"x must be a \(B, 32, \.\.\.\) tensor \(4 fields of 8 "
                                         r"channels\); got \(2, 3, 5\)"):
        field_batch_norm(torch.randn(2, 3, 5), inner_norms(ours)[0], 8)
    gspace = rotation_gspace()
    scalars = FieldBatchNorm(enn.FieldType(gspace, [gspace.trivial_repr] * 3)).train()
    with pytest.raises(ValueError, match="expected more than 1 value per field when training"):
        scalars(enn.GeometricTensor(torch.randn(1, 3, 1, 1), scalars.in_type))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_double_backward_raises(mode):
    _, ours = make_pair()
    ours.train(mode == "train")
    x = random_input(ours.in_type).requires_grad_()
    y = ours(enn.GeometricTensor(x, ours.in_type)).tensor
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad((y * torch.randn_like(y)).sum(), x, create_graph=True)


def with_e2cnn_norms(model):
    """A copy of `model` with every FieldBatchNorm replaced by e2cnn's InnerBatchNorm (same state)."""
    ref = copy.deepcopy(model)
    for parent in list(ref.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FieldBatchNorm):
                inner = enn.InnerBatchNorm(child.in_type, child.eps, child.momentum, child.affine,
                                           child.track_running_stats).to(torch.float64)
                inner.load_state_dict(child.state_dict(), strict=True)
                setattr(parent, name, inner)
    return ref


@pytest.mark.parametrize("kwargs", [dict(), dict(frozen_stages=1, norm_eval=True), dict(frozen_stages=2)],
                         ids=["default", "frozen1_norm_eval", "frozen2"])
def test_re_resnet_train_step_matches_e2cnn_norms(kwargs):
    """ReResNet's frozen stages and norm_eval find and switch FieldBatchNorm's inner BatchNorms as
    they did e2cnn's: the same outputs, gradients and running statistics after two steps."""
    torch.manual_seed(0)
    model = ReResNet(depth=18, base_channels=16, **kwargs).double()
    assert not any(type(m) is enn.InnerBatchNorm for m in model.modules())
    assert sum(isinstance(m, FieldBatchNorm) for m in model.modules()) == 20
    ref = with_e2cnn_norms(model)
    assert sum(type(m) is enn.InnerBatchNorm for m in ref.modules()) == 20
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(2):
        x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
        results = []
        for m in (model, ref):
            m.train()
            outs = m(x)
            sum((o * torch.cos(o)).sum() for o in outs).backward()
            grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
            m.zero_grad(set_to_none=True)
            results.append((outs, grads, m.state_dict()))
        (outs, grads, our_state), (ref_outs, ref_grads, ref_state) = results
        assert_all_close([o.detach() for o in outs], [o.detach() for o in ref_outs], rtol=1e-9, atol=1e-9)
        assert grads.keys() == ref_grads.keys()
        assert_all_close(list(grads.values()), list(ref_grads.values()), rtol=1e-8, atol=1e-8)
        assert our_state.keys() == ref_state.keys()
        assert_all_close(list(our_state.values()), list(ref_state.values()), rtol=1e-10, atol=1e-10)
    frozen_stages = kwargs.get("frozen_stages", -1)
    frozen = (["conv1.", "bn1."] if frozen_stages >= 0 else []) + [
        f"layer{i}." for i in range(1, frozen_stages + 1)]
    for name, p in model.named_parameters():
        is_frozen = any(name.startswith(f) for f in frozen)
        assert (name in grads) == (not is_frozen) == p.requires_grad, name
    for name, value in model.state_dict().items():
        if "running_" in name:
            unchanged = torch.equal(value, before[name])
            assert unchanged == (kwargs.get("norm_eval", False)
                                 or any(name.startswith(f) for f in frozen)), name


LAYOUTS = pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last],
                                  ids=["nchw", "nhwc"])


@pytest.mark.cuda
@LAYOUTS
@pytest.mark.parametrize("kind", ["regular", "mixed"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
                         or "default")
def test_cuda_float64_matches_e2cnn(kind, settings, layout):
    """torch's SyncBatchNorm kernels as the field norm uses them, in float64 against e2cnn's
    module (native CUDA batch norm in float64): training steps, then eval."""
    torch.manual_seed(0)
    ref, ours = make_pair(kind, **settings)
    ref, ours = ref.cuda(), ours.cuda()
    for step, mode in enumerate((True, True, False)):
        ref.train(mode), ours.train(mode)
        x = random_input(ours.in_type, batch=2 + step, h=9, w=11).cuda()
        x, grad = x.contiguous(memory_format=layout), torch.randn_like(x)
        out = run(ours, x, grad)
        assert out[0].is_contiguous(memory_format=layout)
        assert_all_close(out, run(ref, x, grad), rtol=1e-10, atol=1e-10)
        assert_all_close(state(ours), state(ref), rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@LAYOUTS
@pytest.mark.parametrize("kind", ["regular", "mixed"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16_autocast"])
def test_cuda_matches_e2cnn(amp, kind, layout):
    torch.manual_seed(0)
    ref, ours = make_pair(kind, dtype=torch.float32)
    ref, ours = ref.cuda(), ours.cuda()
    x = random_input(ours.in_type, batch=2, h=64, w=64, dtype=torch.float32).cuda()
    x = x.contiguous(memory_format=layout)
    grad = torch.randn_like(x)
    if amp:
        x, grad = x.half(), grad.half()
    exact_ref = copy.deepcopy(ref).double()  # float64 on the same (rounded) inputs
    for mode in (True, False):
        ref.train(mode), ours.train(mode), exact_ref.train(mode)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            out, expected = run(ours, x, grad), run(ref, x, grad)
        exact = run(exact_ref, x.double(), grad.double())
        assert [o.dtype for o in out] == [o.dtype for o in expected]
        if amp:
            # fp16: a parameter gradient sums 2*8*64*64 rounded products, and ours and e2cnn's round
            # differently; ours must be about as close to float64 as e2cnn's is
            for o, e, ex in zip(out, expected, exact):
                our_err, their_err = (o.double() - ex).abs().max(), (e.double() - ex).abs().max()
                assert our_err <= max(2 * their_err, 4e-3 * ex.abs().max() + 1e-3)
        else:
            assert_all_close(out, expected, rtol=1e-4, atol=1e-4)
        assert_all_close(state(ours), state(ref), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@LAYOUTS
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16_autocast"])
def test_cuda_field_norm_waits_for_nothing_and_captures(amp, layout):
    """A training forward and backward reads nothing back, and replayed as a CUDA graph gives
    the eager results and running statistics."""
    torch.manual_seed(0)
    _, ours = make_pair(dtype=torch.float32)
    ours = ours.cuda().train()
    twin = copy.deepcopy(ours)
    x = random_input(ours.in_type, batch=2, h=32, w=32, dtype=torch.float32).cuda()
    x = x.contiguous(memory_format=layout).requires_grad_()
    grad = torch.randn_like(x)

    def step(module, x):
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            y = module(enn.GeometricTensor(x, module.in_type)).tensor
        return (y,) + torch.autograd.grad(y, (x,) + tuple(module.parameters()), grad)

    graph, captured = capture(lambda x: step(ours, x), x)  # two warm-up steps, then the capture
    graph.replay()
    torch.cuda.synchronize()
    with waits_for_nothing():
        for _ in range(3):
            expected = step(twin, x)
    torch.cuda.synchronize()
    assert_all_close(list(captured), list(expected), rtol=1e-5, atol=1e-5)
    assert_all_close(state(ours), state(twin), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('layout', ['regular', 'mixed', 'interleaved'])
def test_one_pass_grouping_is_e2cnns(layout):
    """The fields' grouping FieldBatchNorm's constructor uses equals e2cnn's indexes_from_labels
    (labels by size, as InnerBatchNorm asks, and by name), contiguous groups or not; the built
    norm holds e2cnn's buffers."""
    from e2cnn.nn.modules.utils import indexes_from_labels
    from redet_plugin.models.layers.field_batch_norm import _indexes_by_label
    gspace = rotation_gspace(8)
    regular, trivial = gspace.regular_repr, gspace.trivial_repr
    representations = {'regular': [regular] * 6,
                       'mixed': [regular] * 3 + [trivial] * 4,
                       'interleaved': [regular, trivial, regular, trivial, trivial, regular]}[layout]
    field_type = enn.FieldType(gspace, representations)
    for labels in ([r.size for r in representations], [r.name for r in representations]):
        assert _indexes_by_label(field_type, labels) == indexes_from_labels(field_type, labels)
    ours = FieldBatchNorm(field_type)
    theirs = enn.InnerBatchNorm(field_type)
    assert ours._contiguous == theirs._contiguous and ours._nfields == theirs._nfields
    assert {k: v.tolist() for k, v in ours.named_buffers() if k.startswith('indices_')} == \
        {k: v.tolist() for k, v in theirs.named_buffers() if k.startswith('indices_')}
