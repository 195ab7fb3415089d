"""ReFPN: shapes as mmdet's FPN, export to plain PyTorch, training, bad arguments."""
import pytest
import torch
from e2cnn import nn as enn
from mmdet.registry import MODELS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models import convert_to_plain
from redet_plugin.models.necks import ReFPN

TINY_IN = [16, 32, 64, 128]


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def pyramid(channels, size=64, batch=2):
    return [torch.randn(batch, c, size // 4 // 2 ** i, size // 4 // 2 ** i) for i, c in enumerate(channels)]


def test_five_levels_with_max_pool_level():
    neck = ReFPN(TINY_IN, 32, num_outs=5).eval()
    outs = neck(pyramid(TINY_IN, 128))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 32, 32), (2, 32, 16, 16), (2, 32, 8, 8),
                                              (2, 32, 4, 4), (2, 32, 2, 2)]
    assert torch.equal(outs[4], torch.nn.functional.max_pool2d(outs[3], 1, stride=2))


@pytest.mark.parametrize("extra", [False, "on_input"])
def test_training_step_reads_nothing_back_from_the_device(extra):
    """On the meta device any read of a value back to the host raises: on a GPU the neck's
    training forward and backward never wait for the device."""
    neck = ReFPN(TINY_IN, 32, num_outs=5, add_extra_convs=extra).to("meta").train()
    inputs = [x.to("meta").requires_grad_() for x in pyramid(TINY_IN, 128)]
    outs = neck(inputs)
    sum(o.sum() for o in outs).backward()
    assert [tuple(o.shape) for o in outs] == [(2, 32, 32, 32), (2, 32, 16, 16), (2, 32, 8, 8),
                                              (2, 32, 4, 4), (2, 32, 2, 2)]
    assert all(x.grad is not None for x in inputs)


def test_full_width_config_builds_from_registry():
    neck = MODELS.build(dict(type="RedetReFPN", in_channels=[256, 512, 1024, 2048], out_channels=256,
                             num_outs=5)).eval()
    with torch.no_grad():
        outs = neck(pyramid([256, 512, 1024, 2048], 64, batch=1))
    assert [tuple(o.shape) for o in outs] == [(1, 256, 16, 16), (1, 256, 8, 8), (1, 256, 4, 4),
                                              (1, 256, 2, 2), (1, 256, 1, 1)]


@pytest.mark.parametrize("extra", [True, "on_input", "on_lateral", "on_output"])
def test_extra_convs(extra):
    neck = ReFPN(TINY_IN, 16, num_outs=6, start_level=1, add_extra_convs=extra,
                 relu_before_extra_convs=True).eval()
    outs = neck(pyramid(TINY_IN, 128))
    assert len(neck.extra_convs) == 3
    assert [o.shape[-1] for o in outs] == [16, 8, 4, 2, 1, 1]
    assert all(o.shape[1] == 16 for o in outs)


def test_export_gives_the_same_outputs():
    torch.manual_seed(0)
    neck = ReFPN(TINY_IN, 32, num_outs=5, add_extra_convs="on_output").eval()
    inputs = pyramid(TINY_IN, 96)
    with torch.no_grad():
        before = neck(inputs)
        container = torch.nn.ModuleDict(dict(neck=neck))
        assert convert_to_plain(container) is container
        after = neck(inputs)
    assert neck.exported
    assert not any(isinstance(m, enn.EquivariantModule) for m in neck.modules())
    for a, b in zip(after, before):
        assert rel_err(a, b) < 1e-5


def test_train_forward_backward():
    neck = ReFPN(TINY_IN, 32, num_outs=5).train()
    inputs = [x.requires_grad_() for x in pyramid(TINY_IN, 64)]
    outs = neck(inputs)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, p in neck.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(x.grad is not None for x in inputs)


def test_state_dict_round_trip_between_modes():
    src = ReFPN(TINY_IN, 32, num_outs=5).eval()
    dst = ReFPN(TINY_IN, 32, num_outs=5).train()
    dst.load_state_dict(src.state_dict(), strict=True)
    inputs = pyramid(TINY_IN, 64)
    with torch.no_grad():
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(dst.eval()(inputs), src(inputs)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(in_channels=[16, 30], out_channels=32, num_outs=2), r"in_channels\[1\] must be a positive multiple"),
    (dict(in_channels=[16, 32], out_channels=20, num_outs=2), "out_channels must be a positive multiple"),
    (dict(in_channels=[16, 32], out_channels=32, num_outs=1), "num_outs must be >= the 2 input levels"),
    (dict(in_channels=[16, 32], out_channels=32, num_outs=3, add_extra_convs="on_top"), "add_extra_convs must be"),
    (dict(in_channels=[16, 32], out_channels=32, num_outs=3, start_level=2), "start_level must be in"),
    (dict(in_channels=[16, 32], out_channels=32, num_outs=3, end_level=5), "end_level must be -1 or in"),
    (dict(in_channels=[], out_channels=32, num_outs=3), "at least one level"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReFPN(**kwargs)


def test_bad_inputs():
    neck = ReFPN(TINY_IN, 32, num_outs=5)
    with pytest.raises(ValueError, match="expected 4 input levels; got 3"):
        neck(pyramid(TINY_IN)[:3])
    bad = pyramid(TINY_IN)
    bad[2] = torch.randn(2, 60, 4, 4)
    with pytest.raises(ValueError, match=r"inputs\[2\] must be a \(N, 64, H, W\) tensor; got \(2, 60, 4, 4\)"):
        neck(bad)



def test_nearest_upsampling_stays_in_16_bits_under_autocast():
    """CUDA autocast upsamples in float32, which would make every sum of the top-down path, down
    to the largest map, float32. Nearest upsampling only copies values, so it runs in the maps'
    dtype: no float32 map is made, and the outputs are those of float32 upsampling up to the
    16-bit rounding of the sums."""
    from torch.utils._python_dispatch import TorchDispatchMode
    device = "cuda" if torch.cuda.is_available() else "cpu"
    neck = ReFPN(TINY_IN, 32, num_outs=5).to(device).train()
    inputs = [x.to(device, torch.float16) for x in pyramid(TINY_IN, 128)]

    class Float32Maps(TorchDispatchMode):
        made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[:2] == (2, 32)
                    and out.dtype == torch.float32):
                self.made.append((func.overloadpacket.__name__, tuple(out.shape)))
            return out

    with torch.autocast(device, dtype=torch.float16):
        with Float32Maps() as record:
            ours = neck(inputs)
        neck._upsampled = lambda coarse, fine: torch.nn.functional.interpolate(
            coarse.float(), size=fine.shape[2:], mode="nearest")
        float32_upsampling = neck(inputs)
    assert record.made == []
    for a, b in zip(ours, float32_upsampling):
        assert a.dtype == torch.float16 and rel_err(a.float(), b.float()) < 2e-3
