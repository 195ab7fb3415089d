"""The plain ReResNet's convolutions with their ReLU and residual sum in one cuDNN call: make_plain
switches it on where the batch norms are folded, a GPU runs the fused ops with the unfused
results (up to rounding), and every other case (the CPU, autograd) runs the unfused ops."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from redet_plugin.inference.batch_norm_folding import fold_batch_norms
from redet_plugin.inference.plain_model import fuse_epilogues, make_plain
from redet_plugin.models.backbones.re_resnet import ReResNet, _ReBlock
from redet_plugin.models.layers.fused_convolution import conv_add_relu, conv_relu

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device (cuDNN)')


def backbone(depth=18):
    torch.manual_seed(0)
    model = ReResNet(depth=depth, base_channels=16).eval()
    with torch.no_grad():  # (batch norms with statistics of their own, so folding them matters)
        for m in model.modules():
            if hasattr(m, 'running_var'):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


def unfused_copy(model):
    import copy
    copied = copy.deepcopy(model)
    for m in copied.modules():
        if getattr(m, 'fused', False):
            m.fused = False
    return copied


@pytest.mark.parametrize('depth', [18, 50])
def test_make_plain_fuses_the_network_and_every_block(depth):
    model = backbone(depth)
    assert make_plain(model) == 1
    blocks = [m for m in model.modules() if isinstance(m, _ReBlock)]
    assert blocks and model.fused and all(block.fused for block in blocks)


def test_nothing_is_fused_before_the_batch_norms_are_folded():
    model = backbone()
    model.export()
    assert fuse_epilogues(model) == 0 and not model.fused
    fold_batch_norms(model)
    assert fuse_epilogues(model) == 1 + sum(isinstance(m, _ReBlock) for m in model.modules())


@pytest.mark.parametrize('depth', [18, 50])
def test_on_the_cpu_the_fused_network_computes_the_unfused_one(depth):
    model = backbone(depth)
    make_plain(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for ours, theirs in zip(model(x), unfused_copy(model)(x)):
            assert torch.equal(ours, theirs)


def _conv(cin, cout, k, stride, device, channels_last):
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2).to(device)
    return conv.to(memory_format=torch.channels_last) if channels_last else conv


@cuda
@pytest.mark.parametrize('channels_last', [True, False])
@pytest.mark.parametrize('k, stride', [(1, 1), (3, 1), (3, 2)])
@pytest.mark.parametrize('precision', ['float32', 'float16', 'autocast'])
def test_fused_ops_give_the_unfused_results_on_a_gpu(channels_last, k, stride, precision,
                                                     monkeypatch):
    conv = _conv(32, 64, k, stride, 'cuda', channels_last)
    x = torch.randn(2, 32, 40, 40, device='cuda')
    if precision == 'float16':
        conv, x = conv.half(), x.half()
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    calls = []
    for name in ('cudnn_convolution_relu', 'cudnn_convolution_add_relu'):
        op = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _op=op, _n=name, **k: calls.append(_n) or
                            _op(*a, **k))
    # float32 without TF32, which cuDNN may use for one of the two calls and not the other
    with torch.no_grad(), torch.autocast('cuda', enabled=precision == 'autocast'), \
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        residual = torch.randn_like(F.conv2d(x, conv.weight, stride=stride, padding=k // 2))
        expected = (F.relu(conv(x)), F.relu(conv(x) + residual))
        got = (conv_relu(conv, x), conv_add_relu(conv, x, residual))
    assert calls == ['cudnn_convolution_relu', 'cudnn_convolution_add_relu']
    tol = dict(rtol=1e-5, atol=1e-5) if precision == 'float32' else dict(rtol=1e-2, atol=1e-2)
    for ours, theirs in zip(got, expected):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, **tol)


@cuda
def test_with_autograd_the_unfused_ops_run_and_differentiate(monkeypatch):
    monkeypatch.setattr(torch, 'cudnn_convolution_relu', None)  # (would fail if called)
    monkeypatch.setattr(torch, 'cudnn_convolution_add_relu', None)
    conv = _conv(8, 8, 3, 1, 'cuda', True)
    x = torch.randn(1, 8, 16, 16, device='cuda', requires_grad=True)
    out = conv_add_relu(conv, conv_relu(conv, x), x)
    out.sum().backward()
    assert x.grad is not None and conv.weight.grad is not None


@cuda
@pytest.mark.parametrize('amp', [False, True])
def test_the_fused_network_gives_the_unfused_features_on_a_gpu(amp):
    model = backbone(50).cuda().to(memory_format=torch.channels_last)
    make_plain(model)
    x = torch.randn(1, 3, 128, 128, device='cuda').to(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast('cuda', enabled=amp), \
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        ours, theirs = model(x), unfused_copy(model)(x)
    tol = dict(rtol=1e-2, atol=1e-2) if amp else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.float(), b.float(), **tol)
