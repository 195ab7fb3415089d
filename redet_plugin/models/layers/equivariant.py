"""Building blocks for rotation-equivariant networks (e2cnn, cyclic group C_N, regular fields).

A feature map with `channels` plain channels is `channels // N` regular fields; e2cnn lays a
regular field out as N consecutive channels, so channel index = field * N + orientation, which is
the layout RiRoIAlignRotated reads. Rotating the input image counter-clockwise on screen (image
y axis pointing down) by k * 2*pi/N rotates every feature map the same way and moves orientation
channel o to (o + k) mod N: torch.rot90(image, 1, (2, 3)) moves o to o + 2 for C8
(tests/test_models/test_re_resnet.py). Boxes whose angle theta turns the x axis towards +y (le90,
RiRoIAlign with clockwise=True) get theta - pi/2 under that rotation, and RiRoIAlign's
orientation shift floor(theta * N / 2pi) drops by 2: the two agree (test_rotation_invariance.py).

The equivariant modules keep e2cnn's GeometricTensor inside a network and plain tensors at its
borders, so mmdet components see ordinary tensors. `convert_to_plain` swaps every e2cnn module for
the plain PyTorch module with the same numbers (e2cnn's `export`), for fast inference.
"""
import copy
import functools
import math

import torch
from torch import nn

from e2cnn import gspaces
from e2cnn import nn as enn
from e2cnn.nn.init import _generalized_he_init_variances, generalized_he_init
from e2cnn.nn.modules.r2_conv import SingleBlockBasisExpansion

from redet_plugin.models.utils.device_constants import is_capturing

from .lazy_basis_names import lazily_named_bases

NUM_ORIENTATIONS = 8


@functools.lru_cache(maxsize=None)
def rotation_gspace(num_orientations: int = NUM_ORIENTATIONS) -> gspaces.GSpace:
    """The C_N rotation group acting on the plane (one shared instance per N, so field types match)."""
    return gspaces.Rot2dOnR2(N=num_orientations)


def regular_type(channels: int, num_orientations: int = NUM_ORIENTATIONS,
                 arg_name: str = "channels") -> enn.FieldType:
    """`channels` plain channels as channels // N regular fields."""
    if channels <= 0 or channels % num_orientations != 0:
        raise ValueError(f"{arg_name} must be a positive multiple of num_orientations="
                         f"{num_orientations} (regular fields of C{num_orientations}); got {channels}")
    gspace = rotation_gspace(num_orientations)
    return enn.FieldType(gspace, [gspace.regular_repr] * (channels // num_orientations))


def trivial_type(channels: int, num_orientations: int = NUM_ORIENTATIONS) -> enn.FieldType:
    """`channels` scalar fields (e.g. the RGB channels of an image)."""
    gspace = rotation_gspace(num_orientations)
    return enn.FieldType(gspace, [gspace.trivial_repr] * channels)


class FieldSequential(enn.SequentialModule):
    """e2cnn's SequentialModule whose modules can also be replaced by name, as tools that rebuild
    a model child by child do (mmengine's revert_sync_batchnorm, run by every Runner): e2cnn's
    add_module only appends, so re-adding a child failed its type check and mmengine warned
    "Failed to convert ... from SyncBN to BN!" for each of these modules."""

    def add_module(self, name: str, module: nn.Module) -> None:
        if name not in self._modules:
            return super().add_module(name, module)
        old = self._modules[name]
        if (module.in_type, module.out_type) != (old.in_type, old.out_type):
            raise ValueError(f"{type(self).__name__}: module {name!r} can only be replaced by one "
                             f"with the same field types ({old.in_type} -> {old.out_type}); got "
                             f"{module.in_type} -> {module.out_type}")
        nn.Module.add_module(self, name, module)


def r2conv(in_type: enn.FieldType, out_type: enn.FieldType, kernel_size: int, stride: int = 1,
           padding: int = 0, bias: bool = False) -> enn.R2Conv:
    """An equivariant conv, initialised like e2cnn's generalised He init, but fast (see he_init_)."""
    conv = _bare_r2conv(in_type, out_type, kernel_size, stride, padding, bias)
    he_init_(conv)
    return conv


class CachedFilterR2Conv(enn.R2Conv):
    """e2cnn's R2Conv that owns its basis and whose eval-mode filter cache never enters state_dict.

    e2cnn hands every conv with the same basis one shared basis module (its `_stored_filters`
    cache), so `.double()`, `.cuda()` or `load_state_dict` on one model would change the basis of
    every other model in the process. Each conv here gets its own copy of the sampled numbers.

    e2cnn keeps the expanded filter (and bias) as buffers: a zero one from construction, a real one
    after eval(). Here they are plain attributes, expanded again when the module is moved or
    converted (_apply), and in neither state_dict nor buffers(): a state_dict would depend on the
    mode it was saved in (and a strict load into an eval-mode model fail), and buffers() would
    list other tensors in each mode (mmengine's EMA pairs a copy's buffers with the model's by
    position). Train mode holds no dense copy of the filters. The eval-mode filter is computed without autograd: a
    tensor holding a graph keeps that graph alive and cannot be deep-copied. It is expanded again
    only when the weights changed, also by eval() (e2cnn's would keep a stale one), and kept
    through train() where the weights are frozen. "Changed" includes writes through `.data`,
    which torch does not count (mmdet's MeanTeacherHook and mmengine's EMA update weights so):
    the weights the filter was expanded from are kept and compared (one host synchronisation per
    kept conv and train()/eval() call).
    """

    _CACHE = ("filter", "expanded_bias")

    def __init__(self, *args, **kwargs):
        with lazily_named_bases():
            super().__init__(*args, **kwargs)
        _own_basis(self.basisexpansion, like=self.weights)
        self._drop_cache()
        self._cache_of = None  # the weights' state its eval-mode filter was expanded from
        self._cache_weights = None  # and the weights themselves (see the docstring)
        self.register_load_state_dict_pre_hook(_ignore_saved_cache)
        # an eval-mode conv must not keep running with the filter of the weights before loading
        self.register_load_state_dict_post_hook(_refresh_after_load)

    def _drop_cache(self):
        for name in self._CACHE:
            if name in self._buffers:
                del self._buffers[name]
            elif name in self.__dict__:
                del self.__dict__[name]

    def train(self, mode: bool = True):
        # The filter is kept, and not expanded again, where it is still the filter of the weights:
        # in eval(), and in train() when the weights are frozen. mmengine's loops call
        # model.train() every iteration, which sent frozen stages (put straight back in eval)
        # through a new expansion each time, into new tensors.
        keep = not mode or not any(p.requires_grad for p in self._expanded_from())
        if keep and self._cache_is_current():
            return nn.Module.train(self, mode)
        self._drop_cache()
        self.training = True  # (e2cnn's train(False) expands only when leaving training)
        with torch.no_grad():
            super().train(mode)
        for name in self._CACHE:  # e2cnn registered them as buffers
            if name in self._buffers:
                setattr(self, name, self._buffers.pop(name))
        self._cache_of = None if mode else self._weights_state()
        self._cache_weights = None if mode else [p.detach().clone() for p in self._expanded_from()]
        return self

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .double(), ...: an eval-mode filter is expanded again from the converted
        # weights (a converted float32 filter would differ from them in double)
        super()._apply(fn, *args, **kwargs)
        self._cache_of = None
        if not self.training:
            self.train(False)
        return self

    def cached_tensors(self) -> list:
        """The eval-mode filter (and bias) where expanded: tensors the module reads in place
        that are not buffers (for FeatureGraphs, which captures again when one is replaced)."""
        return [t for t in (self.__dict__.get(name) for name in self._CACHE)
                if isinstance(t, torch.Tensor)]

    def refresh_cache(self):
        """Rebuild the eval-mode filter from the current weights (e.g. after load_state_dict)."""
        if not self.training:
            self._cache_of = None
            self.train(False)

    def _expanded_from(self) -> list:
        return [p for p in (self.weights, getattr(self, "bias", None)) if p is not None]

    def _weights_state(self) -> tuple:
        # in-place changes bump _version; replaced or converted tensors change data_ptr or dtype
        return tuple((p.data_ptr(), p._version, p.dtype) for p in self._expanded_from())

    def _cache_is_current(self) -> bool:
        cache_of = getattr(self, "_cache_of", None)  # (None too while e2cnn's __init__ runs)
        if "filter" not in self.__dict__ or cache_of is None or cache_of != self._weights_state():
            return False
        return all(torch.equal(kept, p)
                   for kept, p in zip(self._cache_weights, self._expanded_from()))


_MODULE_STATE = frozenset(vars(nn.Module()))  # what torch keeps in every module: registries, hooks


class _OwnedBlockBasis(SingleBlockBasisExpansion):
    """A block basis owned by one conv: compared and hashed by identity. e2cnn's hash and ==
    (meant for its cache of shared bases) hash the whole basis description and compare tensors,
    and torch hashes every module on each modules() / parameters() / buffers() walk: ReResNet-50
    took about 20 ms per walk on a CPU core."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        # e2cnn's expansion, but under autocast the basis (a constant) is cast to the autocast
        # dtype once and kept, not by einsum in every call: one kernel less per conv and step
        basis = self.sampled_basis
        device_type = basis.device.type
        if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
            basis = self._basis_as(torch.get_autocast_dtype(device_type))
        return torch.einsum("boi...,kb->koi...", basis, weights)

    def _basis_as(self, dtype: torch.dtype) -> torch.Tensor:
        basis = self.sampled_basis
        if not basis.is_floating_point() or basis.dtype == torch.float64:
            return basis  # (autocast leaves these alone)
        # (the tensor itself, not its address: a converted basis may reuse a freed one)
        kept = self.__dict__.get("_basis_in_autocast_dtype")
        if kept is not None and kept[0] is basis and kept[1:3] == (basis._version, dtype):
            return kept[3]
        cast = basis.to(dtype)
        if not is_capturing(basis.device):  # (device_constants says why)
            self.__dict__["_basis_in_autocast_dtype"] = (basis, basis._version, dtype, cast)
        return cast


def _own_basis(expansion: nn.Module, like: torch.Tensor) -> None:
    """Replace each shared block basis inside `expansion` by a copy with its own tensors and module
    registries, as `like`'s dtype and device. e2cnn's description of the basis (read-only Python
    objects) stays shared; the submodule names, and so the state_dict keys, stay."""
    for name, block in list(expansion.named_children()):
        if isinstance(block, SingleBlockBasisExpansion):
            memo = {id(v): v for k, v in vars(block).items() if k not in _MODULE_STATE}
            memo.update({id(t): t.clone() for t in block.buffers()})
            owned = copy.deepcopy(block, memo).to(like)
            owned.__class__ = _OwnedBlockBasis
            expansion.add_module(name, owned)


def isolate_e2cnn_bases(model: nn.Module) -> nn.Module:
    """Give every e2cnn conv inside `model` (e.g. mmrotate's ReDet, built from plain e2cnn R2Convs)
    its own copy of its sampled basis, as our CachedFilterR2Conv does from the start; returns
    `model`. Without it, `.cuda()`, `.double()` or a state_dict load on that model would also move
    or change the basis of every other e2cnn model in the process with the same basis. Outputs
    stay exactly as they were."""
    for module in model.modules():
        expansion = getattr(module, "basisexpansion", None)
        if isinstance(module, enn.EquivariantModule) and isinstance(expansion, nn.Module):
            _own_basis(expansion, like=module.weights)
    return model


# (in type, out type, kernel size, stride, padding, bias) -> a conv never handed out
_PROTOTYPES = {}


def _bare_r2conv(in_type, out_type, kernel_size, stride=1, padding=0, bias=False) -> enn.R2Conv:
    """An uninitialised CachedFilterR2Conv: built once per layout in a process, then copied.

    e2cnn's construction loops in Python over every pair of fields (most of the minute that
    building ReResNet-50 took on a CPU), and a ResNet repeats its layouts block after block.
    A copy has the same basis and no random draws were made for it (initialize=False), so a
    model built from copies equals one built from scratch."""
    key = (in_type, out_type, kernel_size, stride, padding, bias)
    prototype = _PROTOTYPES.get(key)
    if prototype is None:
        # frequencies_cutoff = 3 r is the basis the published ReDet checkpoints were trained
        # with; the same basis is needed for their coefficients to mean the same filters.
        prototype = _PROTOTYPES[key] = CachedFilterR2Conv(
            in_type, out_type, kernel_size, stride=stride, padding=padding, bias=bias,
            sigma=None, frequencies_cutoff=lambda r: 3 * r, initialize=False)
    return copy.deepcopy(prototype, _shared_objects(prototype, in_type, out_type))


def _shared_objects(prototype: enn.R2Conv, in_type, out_type) -> dict:
    """A deepcopy memo that keeps the group, its representations and the caller's field types
    shared (e2cnn compares field types by their group and representations), and the basis
    element names, which e2cnn never changes after construction (a dict and a list with an
    entry per basis element: copying them took most of a copy's time)."""
    gspace = in_type.gspace
    group = gspace.fibergroup
    expansion = prototype.basisexpansion
    names = [getattr(expansion, name, None) for name in ("_ids_to_basis", "_basis_to_ids")]
    shared = [gspace, group, *group.representations.values(), *group.irreps.values(),
              *(n for n in names if n is not None)]
    memo = {id(obj): obj for obj in shared}
    memo[id(prototype.in_type)] = in_type
    memo[id(prototype.out_type)] = out_type
    return memo


@torch.no_grad()
def he_init_(conv: enn.R2Conv) -> None:
    """e2cnn's generalized_he_init in milliseconds for convs between fields of one kind each.

    e2cnn computes a std per basis coefficient by a Python loop over all coefficients (46 of the
    61 s that building ReResNet-50 took). With n_in equal input fields, each output irrep's count of
    basis elements per input irrep is n_in times that of a one-field-to-one-field conv, so the std
    is that conv's std / sqrt(n_in); coefficients are laid out (out field, in field, block basis).
    tests/test_models/test_re_resnet.py checks this against e2cnn's own computation.
    """
    in_names = {r.name for r in conv.in_type.representations}
    out_names = {r.name for r in conv.out_type.representations}
    if len(in_names) != 1 or len(out_names) != 1:  # mixed fields: e2cnn's own (slow) init
        generalized_he_init(conv.weights.data, conv.basisexpansion)
        return
    n_in, n_out = len(conv.in_type), len(conv.out_type)
    block_std = _one_field_he_std(conv.in_type.representations[0].name,
                                  conv.out_type.representations[0].name, conv.kernel_size,
                                  conv.in_type.gspace)
    std = (block_std / math.sqrt(n_in)).repeat(n_out * n_in)
    conv.weights.data.copy_(std * torch.randn_like(std))


@functools.lru_cache(maxsize=None)
def _one_field_he_std(in_name: str, out_name: str, kernel_size: int, gspace) -> torch.Tensor:
    one_in = enn.FieldType(gspace, [gspace.representations[in_name]])
    one_out = enn.FieldType(gspace, [gspace.representations[out_name]])
    block = _bare_r2conv(one_in, one_out, kernel_size)
    return _generalized_he_init_variances(block.basisexpansion)


def to_plain(x):
    """A plain tensor from a GeometricTensor (or the tensor itself once the model is exported)."""
    return x.tensor if isinstance(x, enn.GeometricTensor) else x


class EquivariantNetwork(nn.Module):
    """Mixin for networks built from e2cnn modules with plain tensors at their borders.

    - `export()` turns the network into plain PyTorch modules (in place; eval mode).
    """

    exported = False

    def export(self):
        """Replace every e2cnn module by its plain PyTorch equivalent (in place); returns self."""
        if not self.exported:
            param = next(self.parameters(), None)
            _export_children(self)
            self.exported = True
            if param is not None:  # exported BatchNorms are created on the CPU
                self.to(param.device)
        return self.eval()

    def wrap_input(self, x: torch.Tensor, field_type: enn.FieldType, arg_name: str):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != field_type.size:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__}: {arg_name} must be a (N, {field_type.size}, H, W) "
                             f"tensor; got {got}")
        return self.wrap(x, field_type)

    def wrap(self, x: torch.Tensor, field_type: enn.FieldType):
        """`x` as a GeometricTensor of `field_type`; the plain tensor itself once exported."""
        return x if self.exported else enn.GeometricTensor(x, field_type)


def _export_children(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, enn.EquivariantModule):
            setattr(module, name, child.export())
        else:
            _export_children(child)


def _ignore_saved_cache(conv: CachedFilterR2Conv, state_dict, prefix, *_args) -> None:
    for name in CachedFilterR2Conv._CACHE:
        state_dict.pop(prefix + name, None)


def _refresh_after_load(conv: CachedFilterR2Conv, _incompatible_keys) -> None:
    conv.refresh_cache()


def convert_to_plain(model: nn.Module) -> nn.Module:
    """Export every equivariant network inside `model` (e.g. a whole detector) to plain PyTorch."""
    for m in list(model.modules()):
        if isinstance(m, EquivariantNetwork):
            m.export()
    return model
