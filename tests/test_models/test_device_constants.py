"""device_constants.constant: the values in the dtype asked for, one tensor kept per key, a fresh
one while a graph is being captured, and no copy from the host (which would wait for a GPU)."""
import torch

from redet_plugin.models.utils import device_constants
from redet_plugin.models.utils.device_constants import constant


def test_values_dtype_and_device():
    got = constant((0.1, 0.1, 0.2, 0.2, 0.1), torch.float32, "cpu")
    assert torch.equal(got, torch.tensor([0.1, 0.1, 0.2, 0.2, 0.1]))  # rounded as torch rounds
    assert torch.equal(constant((7,) * 8, torch.int32, "cpu"), torch.full((8,), 7, dtype=torch.int32))
    assert constant((), torch.float64, "cpu").shape == (0,)
    assert constant([1.5, 2], torch.float64, torch.device("meta")).device.type == "meta"


def test_kept_per_key():
    a = constant((1.0, 2.0), torch.float32, "cpu")
    assert constant([1.0, 2.0], torch.float32, torch.device("cpu")) is a
    assert constant((1.0, 2.0), torch.float64, "cpu") is not a
    assert constant((1.0, 3.0), torch.float32, "cpu") is not a


def test_made_anew_while_capturing(monkeypatch):
    monkeypatch.setattr(device_constants, "is_capturing", lambda device: True)
    a, b = (constant((3.0, 4.0), torch.float32, "cpu") for _ in range(2))
    assert a is not b and torch.equal(a, torch.tensor([3.0, 4.0]))


def test_no_copy_from_the_host(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.tensor: a copy from the host")
    monkeypatch.setattr(torch, "tensor", refuse)
    assert constant((5.0, 6.0, 5.0), torch.float32, "cpu").tolist() == [5.0, 6.0, 5.0]


def test_kept_in_a_bounded_cache_unless_capturing(monkeypatch):
    cache, made = {}, []

    def make(v):
        return lambda: made.append(v) or torch.tensor([v])
    from redet_plugin.models.utils.device_constants import kept_in
    a = kept_in(cache, "a", 2, make(1.0), "cpu")
    assert kept_in(cache, "a", 2, make(9.0), "cpu") is a and made == [1.0]
    kept_in(cache, "b", 2, make(2.0), "cpu")
    kept_in(cache, "c", 2, make(3.0), "cpu")  # drops the oldest, "a"
    assert list(cache) == ["b", "c"]
    monkeypatch.setattr(device_constants, "is_capturing", lambda device: True)
    assert kept_in(cache, "d", 2, make(4.0), "cpu").tolist() == [4.0] and list(cache) == ["b", "c"]


def test_constants_made_while_exporting_are_not_kept():
    """torch.export traces with stand-in (fake) tensors: kept, they would reach later eager steps."""
    from torch._subclasses.fake_tensor import FakeTensor

    from redet_plugin.models.utils import constant, full, kept_in
    values = (2.5, -3.25, 7.125)  # (values no other test keeps)
    cache = {}

    class Scaled(torch.nn.Module):
        def forward(self, x):
            made = kept_in(cache, 'key', 4, lambda: x.new_ones(3), x.device)
            return x * constant(values, x.dtype, x.device) + full(3, 0.75, x.dtype, x.device) + made

    torch.export.export(Scaled(), (torch.ones(3),), strict=False)
    assert cache == {}
    for kept in (constant(values, torch.float32, 'cpu'), full(3, 0.75, torch.float32, 'cpu')):
        assert not isinstance(kept, FakeTensor)
    torch.testing.assert_close(Scaled()(torch.ones(3)), torch.tensor([4.25, -1.5, 8.875]))
