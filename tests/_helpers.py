"""Helpers of the tests only. What users can apply to their own models and ops (host-wait and
layout checks, CUDA-graph capture), and the op inputs the benchmarks and sanitizer drivers share,
ship in redet_plugin/testing.py. mm imports stay inside the functions, so that the ops tests load
torch and the ops only."""
import contextlib
import json
import math
import os
import os.path as osp
import socket
import uuid

import torch

from redet_plugin.testing import deterministic_algorithms, tf32  # noqa: F401  (the tests' too)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


# ---- test session -------------------------------------------------------------------------------
def once_per_run(tmp_path_factory, name: str, make):
    """make()'s result, made once in the whole test run. Under pytest-xdist each worker would build
    a session fixture of its own: compiled packages and trained checkpoints take minutes, and
    several workers building them at once hold the cores the other tests need. The first worker
    to ask makes it under a file lock and leaves the result (JSON: paths, numbers) for the others.
    make() must leave what it returns valid for the rest of the run (files under tmp_path_factory)."""
    if not os.environ.get('PYTEST_XDIST_WORKER'):
        return make()
    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp().parent / f'{name}.json'  # one folder per run
    with FileLock(f'{shared}.lock'):
        if shared.is_file():
            return json.loads(shared.read_text())
        value = make()
        shared.write_text(json.dumps(value, default=float))
        return value


def own_logger(prefix: str) -> str:
    """A --cfg-options entry giving a tools run (main() called in the test's process) a logger
    of its own. mmengine names a run's logger after its config and the second the run started,
    and keeps one instance per name: a run started in the same second as an earlier one logs
    into that run's file (and its work dir gets no log)."""
    return f'experiment_name={prefix}-{uuid.uuid4().hex}'


@contextlib.contextmanager
def all_cores():
    """torch's threads on every core for the block. Under pytest-xdist each worker gets its share
    of the cores (tests/conftest.py): one thread on a 16-core machine with 16 workers, where a
    whole detector tested on the CPU would then end the run alone minutes after the rest."""
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- numerics -----------------------------------------------------------------------------------
def full_fp32():
    """No TF32 for the block (redet_plugin.testing.tf32(False))."""
    return tf32(False)


def peak_cpu_bytes(fn):
    """(The most CPU memory that tensors made by fn() held at once, in bytes, fn()'s result), from
    the allocations and frees torch's profiler records."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    changes = sorted((event.start_ns(), event.nbytes())
                     for event in prof.profiler.kineto_results.events()
                     if event.name() == '[memory]')
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak, result


def assert_close_to_scale(ours, ref, tol):
    """Each pair of tensors close up to tol relative to the reference's largest value (in float32
    the flow projection's depth gradient, -(G + out)/count, cancels large terms: the summation
    order shows at the scale of the largest value, not of each element)."""
    for a, b in zip(ours, ref, strict=True):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.cpu().double(), b.cpu().double(), rtol=tol, atol=tol * scale)


# ---- processes ----------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port of this host that nothing listens on (a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# ---- depth-aware flow projection ----------------------------------------------------------------
def flow_tolerance(dtype):
    """The flow projection's tolerance against the reference, by dtype."""
    return {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}.get(dtype, 1e-10)


def ours_and_reference_grads(flow, depth, t, fill, inverse=False, check=True):
    """[ours, reference]: each (output, count, flow gradient, depth gradient) of the flow
    projection for one random grad_output."""
    import redet_plugin.ops  # noqa: F401  (loads the op)
    from tests.test_ops._reference import depth_flow_projection_reference
    op = torch.ops.redet.depth_flow_projection.default
    grad = torch.randn(flow.shape, generator=torch.Generator().manual_seed(5)).to(flow.device,
                                                                                  flow.dtype)
    results = []
    for fn in (lambda f, d: op(f, d, t, inverse, fill, check),
               lambda f, d: depth_flow_projection_reference(f, d, t, fill, inverse)):
        f, d = flow.detach().clone().requires_grad_(), depth.detach().clone().requires_grad_()
        out, count = fn(f, d)
        out.backward(grad)
        results.append((out, count, f.grad, d.grad))
    return results


# ---- detector -----------------------------------------------------------------------------------
TINY_MODEL_BASE = osp.join(REPO, 'configs/_base_/models/redet-le90_re50_refpn.py')


def tiny_model_cfg(num_classes=3):
    """The ReDet model config shrunk to an R18 backbone with few channels (CPU-sized), with
    the step and the test forward eager."""
    from mmengine.config import Config
    import redet_plugin.mm  # noqa: F401  (registers the mm layer)
    cfg = Config.fromfile(TINY_MODEL_BASE).model
    cfg.backbone.update(depth=18, base_channels=16)
    cfg.neck.update(in_channels=[16, 32, 64, 128], out_channels=32)
    cfg.rpn_head.update(in_channels=32, feat_channels=32)
    for extractor in cfg.roi_head.bbox_roi_extractor:
        extractor.out_channels = 32
    for head in cfg.roi_head.bbox_head:
        head.update(in_channels=32, fc_out_channels=64, num_classes=num_classes)
    cfg.train_cfg.rcnn[0].sampler.num = cfg.train_cfg.rcnn[1].sampler.num = 64
    cfg.test_cfg.rpn.update(nms_pre=200, max_per_img=100)
    cfg.train_cfg.rpn_proposal.update(nms_pre=200, max_per_img=100)
    # the configs capture the whole step and test forward on a GPU and run the test forward's
    # matrix products in TF32; the tests' reference model runs them eagerly (backbone + neck as
    # graphs) in torch's precision, and each test of an option turns it on
    cfg.update(cuda_graph_features=True, cuda_graph_step=False, cuda_graph_predict=False,
               tf32_predict=False)
    return cfg


def tiny_detector(device='cpu'):
    """The tiny ReDet (tiny_model_cfg), initialised from seed 0, on `device`."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    torch.manual_seed(0)
    detector = MODELS.build(tiny_model_cfg()).to(device)
    detector.init_weights()
    return detector


def make_samples(num_images=2, size=128, num_boxes=(3, 0)):
    """DetDataSamples with random rotated ground-truth boxes (num_boxes per image, cycled)."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    samples = []
    for i in range(num_images):
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size),
                                             pad_shape=(size, size), scale_factor=(1.0, 1.0),
                                             batch_input_shape=(size, size)))
        k = num_boxes[i % len(num_boxes)]
        g = torch.Generator().manual_seed(i)
        centres = 30 + torch.rand(k, 2, generator=g) * (size - 60)
        sizes = 12 + torch.rand(k, 2, generator=g) * 30
        angles = (torch.rand(k, 1, generator=g) - 0.5) * math.pi
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([centres, sizes.max(1, keepdim=True)[0],
                              sizes.min(1, keepdim=True)[0], angles], 1),
            labels=torch.randint(0, 3, (k,), generator=g))
        samples.append(sample)
    return samples


# ---- mmrotate-dev 1.0.1 -------------------------------------------------------------------------
# mmrotate imports torchvision in one detector module (h2rbox_v2: `torchvision.transforms`), and
# torchvision cannot load beside the CPU torch of the CI machines. Only when the real import fails,
# a stand-in with the one function mmrotate uses (and the version string mmengine's Runner logs)
# takes its place; with a working torchvision (the GPU machine) the real one is used.
MMROTATE_STAND_IN_CODE = '''
import sys, types
try:
    import torchvision.transforms  # noqa: F401
except Exception:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.vflip = lambda img: img.flip(-2)
    transforms = types.ModuleType("torchvision.transforms")
    transforms.functional = functional
    torchvision = types.ModuleType("torchvision")
    torchvision.transforms = transforms
    torchvision.__version__ = "0+redet-stand-in"  # mmengine's Runner reports it (collect_env)
    torchvision.__redet_stand_in__ = True
    sys.modules.update({"torchvision": torchvision, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})
'''


def register_mmrotate() -> None:
    """Registers mmrotate's modules; a stand-in is removed again afterwards (mmrotate keeps its
    reference), so that code asking for torchvision later sees it missing, as without mmrotate."""
    import sys
    exec(MMROTATE_STAND_IN_CODE, {"__name__": "redet_tests_stand_in"})
    from mmrotate.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    if getattr(sys.modules.get("torchvision"), "__redet_stand_in__", False):
        for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
            del sys.modules[name]


# ---- RoIPool ------------------------------------------------------------------------------------
def roi_pool_rois(num_rois, num_images, size, generator=None, dtype=torch.float32):
    """Float boxes (batch, x1, y1, x2, y2) in image coordinates: some off the map, some malformed
    (x2 < x1), some tiny."""
    g = generator
    batch = torch.randint(0, num_images, (num_rois, 1), generator=g).float()
    xy1 = torch.rand(num_rois, 2, generator=g) * size * 1.2 - size * 0.1
    wh = torch.rand(num_rois, 2, generator=g) * size * 0.8 - size * 0.1  # some negative
    return torch.cat([batch, xy1, xy1 + wh], dim=1).to(dtype)


def roi_pool_case(seed, dtype=torch.float32, n=2, c=3, h=13, w=17, k=9, scale=0.5):
    """(features, rois) for RoIPool: random features and roi_pool_rois over the image."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(dtype)
    rois = roi_pool_rois(k, n, max(h, w) / scale, g, dtype)
    return x, rois


def roi_pool_tolerance(dtype):
    """RoIPool's gradient tolerance (sums of copied values) by dtype."""
    return {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}.get(dtype, 1e-10)


# ---- RiRoIAlignRotated --------------------------------------------------------------------------
# Max |error| against the float64 reference on the same (rounded) inputs, outputs and gradients of
# scale 2-4 (5 seeds, CPU): forward / backward float32 1.3e-6 / 1.6e-6 (the float geometry's
# rounding), float16 4.9e-4 / 1.5e-3, bfloat16 3.9e-3 / 8.7e-3 (the output's own rounding
# dominates; sums are accumulated in float32).
RIROI_FORWARD_ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3,
                      torch.bfloat16: 1.5e-2}
RIROI_BACKWARD_ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3,
                       torch.bfloat16: 3e-2}
# CUDA vs CPU (and fixed-point vs float atomics) differ by summation order (relative slack), and
# CUDA contracts the sample-coordinate arithmetic into FMAs: a sample that lands within an ulp of
# the peer's (discontinuous) border rule can flip, so float32 gets a little absolute slack too.
RIROI_ORDER_RTOL = {torch.float64: 1e-7, torch.float32: 2e-5, torch.float16: 0, torch.bfloat16: 0}
RIROI_CUDA_FORWARD_ATOL = {**RIROI_FORWARD_ATOL, torch.float32: 5e-5}
# CUDA's backward sums by float atomics in any order; where hundreds of terms of size ~1 cancel,
# fp32 can differ from the CPU's in-order sum by about 1e-5.
RIROI_CUDA_BACKWARD_ATOL = {**RIROI_BACKWARD_ATOL, torch.float32: 5e-5}
# (clockwise, legacy, num_samples, output_size): both CUDA kernel instantiations (fixed 2 x 2 grid
# and any grid) and both orientation modes.
RIROI_CUDA_OPTION_CASES = [(False, False, 2, (7, 7)), (True, True, 0, (3, 4)),
                           (True, False, 1, (2, 5)), (False, True, 3, (1, 1)),
                           (True, True, 2, (6, 7))]


def riroi_rois(num_rois, num_images, map_size, scale, generator, dtype=torch.float64):
    """Rotated RoIs in image coordinates: centres up to 20% off the map, sizes from sub-pixel to
    1.5x the map, angles in [-2pi, 2pi)."""
    g = generator
    extent = map_size / scale
    batch = torch.randint(0, num_images, (num_rois, 1), generator=g).double()
    centre = torch.rand(num_rois, 2, generator=g, dtype=torch.float64) * extent * 1.4 - extent * 0.2
    size = torch.rand(num_rois, 2, generator=g, dtype=torch.float64) ** 2 * extent * 1.5
    theta = (torch.rand(num_rois, 1, generator=g, dtype=torch.float64) * 4 - 2) * math.pi
    return torch.cat([batch, centre, size, theta], dim=1).to(dtype)


def riroi_case(seed, dtype=torch.float64, n=2, fields=2, nO=8, h=13, w=17, k=12, scale=0.5):
    """(features of fields * nO channels, riroi_rois over the image)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, fields * nO, h, w, generator=g, dtype=torch.float64).to(dtype)
    return x, riroi_rois(k, n, max(h, w), scale, g, dtype)


def riroi_levels_case(seed, dtype=torch.float64):
    """(features of 4 FPN levels, rois, levels, scales) for the multi-level op; level 3 gets no
    RoI."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(24, 20), (12, 10), (6, 5), (3, 3)]
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    features = [torch.randn(2, 16, h, w, generator=g, dtype=torch.float64).to(dtype)
                for h, w in sizes]
    rois = riroi_rois(24, 2, 24, 1 / 4, g, dtype)
    levels = torch.randint(0, 3, (24,), generator=g)
    return features, rois, levels, scales


def riroi_call(x, rois, output_size=(3, 4), scale=0.5, num_samples=2, nO=8, clockwise=False,
               legacy=False):
    """redet_plugin.ops.riroi_align_rotated with the tests' defaults."""
    from redet_plugin.ops import riroi_align_rotated
    return riroi_align_rotated(x, rois, output_size, scale, num_samples, nO, clockwise, legacy)


def riroi_reference(x, rois, output_size=(3, 4), scale=0.5, num_samples=2, nO=8, clockwise=False,
                    legacy=False):
    """The plain reference with riroi_call's arguments."""
    from tests.test_ops._reference import riroi_align_rotated_reference
    return riroi_align_rotated_reference(x, rois, output_size, scale, num_samples, nO, clockwise,
                                         legacy)


def riroi_reference_grad(x, rois, grad, **kwargs):
    """The reference's float64 gradient of x for grad_output `grad` (riroi_call's kwargs)."""
    xr = x.detach().double().requires_grad_(True)
    if rois.shape[0] == 0:
        return torch.zeros_like(xr)
    riroi_reference(xr, rois, **kwargs).backward(grad.double())
    return xr.grad


def riroi_raw_backward(grad, rois, x_shape, scale=0.5, num_samples=2, nO=8, clockwise=False,
                       legacy=False):
    """torch.ops.redet._riroi_align_rotated_backward for input of shape x_shape."""
    import redet_plugin.ops  # noqa: F401  (loads the op)
    n, c, h, w = x_shape
    return torch.ops.redet._riroi_align_rotated_backward(grad, rois, scale, num_samples, nO,
                                                         clockwise, legacy, n, c, h, w)

def random_rotated_boxes(n, generator=None, dtype=torch.float32, spread=200.0, clusters=None):
    """(n, 5) le90 boxes, clustered so that many pairs overlap; scores without ties."""
    g = generator
    clusters = clusters or max(1, n // 6)
    centres = torch.rand(clusters, 2, generator=g) * spread
    pick = torch.randint(0, clusters, (n,), generator=g)
    ctr = centres[pick] + torch.randn(n, 2, generator=g) * 4
    wh = torch.rand(n, 2, generator=g) * 30 + 2
    theta = (torch.rand(n, 1, generator=g) - 0.5) * math.pi
    theta = torch.where(torch.rand(n, 1, generator=g) < 0.2, torch.zeros_like(theta), theta)
    boxes = torch.cat([ctr, wh, theta], dim=1).to(dtype)
    scores = torch.randperm(n, generator=g).to(dtype) / max(n, 1) + 0.001
    return boxes, scores


def random_horizontal_boxes(n, generator=None, dtype=torch.float32):
    rboxes, scores = random_rotated_boxes(n, generator, torch.float32)
    x1y1 = rboxes[:, :2] - rboxes[:, 2:4] / 2
    return torch.cat([x1y1, x1y1 + rboxes[:, 2:4]], dim=1).to(dtype), scores.to(dtype)


def pairwise_iou(boxes):
    """(N, N) IoU of (N, 5) rotated boxes (mmcv's box_iou_rotated) or (N, 4) horizontal ones."""
    if boxes.shape[1] == 5:
        from mmcv.ops import box_iou_rotated
        return box_iou_rotated(boxes, boxes)
    lt = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (boxes[:, 2:] - boxes[:, :2]).prod(-1)
    return inter / (area[:, None] + area[None, :] - inter)


def safe_iou_threshold(boxes, labels, near, margin=1e-5):
    """An IoU threshold within 0.05 of `near` that no pair of boxes of one label has an IoU
    within `margin` of. Two correct kernels round differently (a GPU fuses multiply-adds and has
    its own sin and cos), which flips the decision for an IoU a few ulp from the threshold; at
    this threshold none can flip, so their keep masks must be equal."""
    groups = [torch.arange(boxes.shape[0])] if labels is None else [
        (labels == c).nonzero().flatten() for c in labels.unique()]
    values = [torch.tensor([near - 0.05, near + 0.05])]
    for index in groups:
        if index.numel() < 2:  # no pair (mmcv's CUDA IoU also fails on no boxes)
            continue
        group = boxes[index].float()
        iou = pairwise_iou(group).triu(1).flatten().cpu()
        values.append(iou[(iou > near - 0.05) & (iou < near + 0.05)])
    values = torch.cat(values).double().sort().values
    gaps = values[1:] - values[:-1]
    widest = int(gaps.argmax())
    assert gaps[widest] > 2 * margin, 'no IoU threshold far enough from every pair'
    return float(values[widest] + values[widest + 1]) / 2
