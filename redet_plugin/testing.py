"""Checks for testing models and ops, your own included, and the ops' test inputs, shared by the
tests, the compute-sanitizer drivers and the benchmarks. Needs torch only (no mm import), like
redet_plugin.ops.
- channels_last_at_offset: a channels-last view whose data starts at a chosen storage offset;
- capture: a function captured as a CUDA graph on static inputs;
- record_host_syncs: every place a function makes the host wait for the GPU, with its stack;
- waits_for_nothing: a block in which any such wait raises;
- record_layout_mixes: every op of a function that reads or writes feature maps of more than one
  memory layout (each such op converts a layout or takes a slow strided path);
- hole_case, exact_hole_case (HOLE_KINDS): flows whose depth-aware projection leaves large holes,
  and flows whose projection is exact in any summation order."""
import contextlib
import functools
import importlib.util
import os.path as osp
import traceback
import warnings
from collections import Counter
from typing import Optional

import torch

HOLE_KINDS = ["half", "single", "none", "borders", "bands"]


def channels_last_at_offset(x, offset):
    """x's values in channels-last memory that starts `offset` elements into its storage: an odd
    offset misaligns element pairs, so RoIPool's CUDA forward must take its scalar path."""
    n, c, h, w = x.shape
    storage = torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)
    view = storage[offset:].view(n, h, w, c).permute(0, 3, 1, 2)
    view.copy_(x)
    assert view.is_contiguous(memory_format=torch.channels_last) and view.storage_offset() == offset
    return view


SYNC_LIBRARIES = ('redet_plugin', 'mmdet', 'mmcv', 'mmengine', 'mmrotate', 'e2cnn')
_THIS_FILE = osp.realpath(__file__)


@functools.lru_cache(maxsize=None)
def _library_roots() -> tuple:
    """(package folder + separator, library name) of each installed SYNC_LIBRARIES package, from
    its import spec (nothing imported). A frame belongs to a library when its file lies under the
    package's own folder: a checkout's folder may carry a library's name too."""
    roots = []
    for lib in SYNC_LIBRARIES:
        try:
            spec = importlib.util.find_spec(lib)
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            roots.append((osp.join(osp.realpath(folder), ''), lib))
    return tuple(roots)


@functools.lru_cache(maxsize=4096)
def _library_path(filename: str) -> Optional[str]:
    """'lib/relative/path.py' of a file inside a SYNC_LIBRARIES package, else None."""
    path = osp.realpath(filename)
    for root, lib in _library_roots():
        if path.startswith(root):
            return lib + '/' + path[len(root):]
    return None


def _call_site(stack):
    """The innermost frame in a library of SYNC_LIBRARIES (the one that asked), as
    'module:line func', and the chain of such frames that led there (outermost first, at most
    6)."""
    frames = [f for f in stack if _library_path(f.filename)]
    if not frames:
        frames = stack[-1:]

    def name(frame):
        return f'{_library_path(frame.filename) or frame.filename}:{frame.lineno} {frame.name}'
    return name(frames[-1]), [name(f) for f in frames[-6:]]


def record_host_syncs(fn):
    """Runs fn() (on a CUDA device) under torch.cuda.set_sync_debug_mode('warn'), which warns at
    every call that makes the host wait for the GPU (a read-back such as .item() or bool(t), a
    data-dependent shape such as nonzero() or a boolean index, a copy from pageable memory).
    Returns [dict(site, count, stack)], most frequent first; empty when fn never waits."""
    sites, chains = Counter(), {}

    def on_warning(message, category, filename, lineno, file=None, line=None):
        if 'called a synchronizing CUDA operation' not in str(message):
            return
        site, chain = _call_site(traceback.extract_stack()[:-1])
        sites[site] += 1
        chains.setdefault(site, chain)

    torch.cuda.synchronize()
    previous = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter('always')
        warnings.showwarning = on_warning
        torch.cuda.set_sync_debug_mode('warn')
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode('default')
            warnings.showwarning = previous
    torch.cuda.synchronize()
    return [dict(site=site, count=count, stack=chains[site]) for site, count in sites.most_common()]


@contextlib.contextmanager
def waits_for_nothing():
    """Any host synchronisation in the block raises, those inside compiled ops too (they warn
    outside Python's warning machinery): torch.cuda.set_sync_debug_mode('error') after the
    GPU has finished what came before."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode('default')


# ops that only make views or read metadata: they move no data, whatever the layouts
_VIEW_OPS = frozenset({
    'view', '_unsafe_view', 'unsqueeze', 'squeeze', 'permute', 'expand', 'reshape', 'as_strided',
    'slice', 'select', 't', 'transpose', 'detach', 'alias', 'split', 'split_with_sizes', 'unbind',
    'narrow', 'unfold', 'flatten', 'lift_fresh', 'is_same_size', 'sym_size', 'sym_stride',
    'sym_numel', 'sym_storage_offset'})


def _layout(t):
    if t.is_contiguous(memory_format=torch.channels_last):
        return 'channels_last' if not t.is_contiguous() else None  # None: either (C or H*W is 1)
    return 'nchw' if t.is_contiguous() else 'strided'


def record_layout_mixes(fn, batch_size):
    """Runs fn() under a dispatch mode that looks at every op (backward ops included) reading or
    writing feature maps: 4-D tensors of `batch_size` images (weights are not maps, nor broadcast
    values such as the gradient of a mean). An op whose maps come in more than one layout
    (channels-last, NCHW, other strides) converts one of them or takes a slow strided path.
    Returns [dict(op, layouts, count, site)], most frequent first, `site` the innermost frame of
    SYNC_LIBRARIES on the stack when the op ran ('' when there is none, as in a backward started
    outside them); empty when every op reads and writes its maps in one layout."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    found, sites = Counter(), {}

    def maps(tree):
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.dim() == 4
                and t.size(0) == batch_size and 0 not in t.stride()]  # (not a broadcast value)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.split('.')[0] not in _VIEW_OPS:
                layouts = {_layout(t) for t in maps((args, kwargs)) + maps(out)} - {None}
                if len(layouts) > 1:
                    key = (str(func), tuple(sorted(layouts)))
                    found[key] += 1
                    if key not in sites:
                        stack = [f for f in traceback.extract_stack()
                                 if osp.realpath(f.filename) != _THIS_FILE]
                        sites[key] = (_call_site(stack)[0] if any(
                            _library_path(f.filename) for f in stack) else '')
            return out

    with Recorder():
        fn()
    return [dict(op=op, layouts=list(layouts), count=count, site=sites[(op, layouts)])
            for (op, layouts), count in found.most_common()]


def capture(step, *inputs):
    """Warms `step` up on a side stream (as torch.cuda.graph's documentation asks), captures it on
    the static `inputs` and returns (graph, static outputs). Replay with graph.replay()."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*inputs)
    return graph, outputs


def hole_case(kind, batch, height, width, seed=0, dtype=torch.float32):
    """flow (t = 1) and depth whose projection leaves large holes of the given kind (HOLE_KINDS)."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32),
                            torch.arange(width, dtype=torch.float32), indexing="ij")
    noise = 0.3 * torch.randn(batch, 2, height, width, generator=g)
    off = 10.0 * max(height, width) + 10  # lands outside the image
    flow = torch.zeros(batch, 2, height, width)
    if kind == "half":  # everything moves right by half the width: the left half is empty
        flow[:, 0] = width / 2
        flow = flow + noise
    elif kind == "single":  # one source pixel stays (reaching up to four targets), the rest leave
        flow[:, 0] = off
        flow[:, :, height // 3, width // 2] = 0.25
    elif kind == "none":  # every pixel leaves: all holes, nothing to fill from
        flow[:, 0] = off
    elif kind == "borders":  # contraction to the centre: holes along all four borders
        flow[:, 0] = 0.6 * ((width - 1) / 2 - xs)
        flow[:, 1] = 0.6 * ((height - 1) / 2 - ys)
        flow = flow + noise
    elif kind == "bands":  # bands of 37 columns and 23 rows leave: long runs in both directions
        leave = ((xs // 37) % 2 == 1) | ((ys // 23) % 2 == 1)
        flow[:, 0] = torch.where(leave, torch.full_like(xs, off), torch.zeros_like(xs))
        flow = flow + noise
    else:
        raise ValueError(f"unknown hole kind {kind!r}; expected one of {HOLE_KINDS}")
    depth = 0.5 + 4 * torch.rand(batch, 1, height, width, generator=g)
    return flow.to(dtype), depth.to(dtype)


def exact_hole_case(batch, height, width, seed=0, dtype=torch.float32):
    """flow (t = 1) and depth whose projection is exact in any summation order, so that CUDA
    (atomics in any order) and CPU must agree bit for bit, hole filling included: kept source
    pixels move by whole pixels (-1, 0 or 1 each way, staying inside the image), weights are powers
    of two, the others leave the image. Which pixels are kept is drawn per band of rows x band of
    columns with densities 0, 2%, 30% or 100%: empty and full columns and rows, isolated
    non-holes, and runs of holes of every length, both ways, across any segment boundary of the
    kernels."""
    g = torch.Generator().manual_seed(seed)

    def bands(n, longest):  # a band index per position, bands of random length 1..longest
        lengths = torch.randint(1, longest + 1, (n,), generator=g)
        return torch.repeat_interleave(torch.arange(n), lengths)[:n]

    row_band, col_band = bands(height, 300), bands(width, 50)
    levels = torch.randint(0, 4, (batch, height, width), generator=g)
    density = torch.tensor([0.0, 0.02, 0.3, 1.0])[levels]
    density = density[:, row_band][:, :, col_band]  # constant on each band x band block
    keep = torch.rand(batch, height, width, generator=g) < density
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    shift = torch.randint(-1, 2, (batch, 2, height, width), generator=g)
    shift[:, 0] = torch.minimum(torch.maximum(shift[:, 0], -xs), width - 1 - xs)  # stay inside
    shift[:, 1] = torch.minimum(torch.maximum(shift[:, 1], -ys), height - 1 - ys)
    flow = shift.float()
    flow[:, 0] = torch.where(keep, flow[:, 0], torch.full_like(flow[:, 0], 10.0 * width + 10))
    depth = 2.0 ** torch.randint(-1, 3, (batch, 1, height, width), generator=g).float()
    return flow.to(dtype), depth.to(dtype)


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 in cuDNN's convolutions and CUDA's matmuls on (torch's default for cuDNN) or off for
    the block, as it was after it: with it off, two fp32 models compared on a GPU differ by float
    rounding, not by TF32's 10-bit mantissa amplified through a deep network."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the block, as it was after it: the ops'
    deterministic backward paths (no atomic adds), to compare or time them."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)
