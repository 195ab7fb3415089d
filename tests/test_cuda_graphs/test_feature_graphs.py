"""ReDet's cuda_graph_features: backbone + neck replayed as CUDA graphs give the eager results
(forward, gradients, running statistics), recapture when tensors are replaced, fall back to eager
where a graph cannot serve, and refuse a backward whose activations a later replay overwrote."""
import copy
import pickle

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules

from redet_plugin.cuda_graphs import FeatureGraphs
from tests._helpers import full_fp32, make_samples, tiny_model_cfg

register_all_modules(init_default_scope=True)  # the detector builds its parts by mmdet's names
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def no_tf32():
    with full_fp32():  # (graph and eager may get different cuDNN algorithms: compare in fp32)
        yield


def build(graphs=False, device="cpu"):
    torch.manual_seed(0)
    model = MODELS.build(dict(tiny_model_cfg(), cuda_graph_features=graphs))
    model.init_weights()
    return model.to(device)


def features(model, x):
    return model.extract_feat(x)


def seeded_input(seed, size=64):
    return torch.randn(2, 3, size, size, device="cuda",
                       generator=torch.Generator("cuda").manual_seed(seed))


def total(outputs):
    return sum((o.double() * (i + 1)).mean() for i, o in enumerate(outputs))


def assert_same_state(a, b):
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, **TOL, msg=name)


# ---- CPU: options, copies, fallback ---------------------------------------------------------------

def test_options():
    assert build().feature_graphs is None
    assert isinstance(build(True).feature_graphs, FeatureGraphs)
    assert build(dict(max_graphs=3)).feature_graphs.max_graphs == 3
    with pytest.raises(TypeError, match="cuda_graph_features: expected a bool or a dict"):
        build("yes")
    with pytest.raises(ValueError, match="max_graphs must be an int >= 1; got 0"):
        FeatureGraphs(max_graphs=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 1; got 0"):
        FeatureGraphs(warmup=0)


def test_copies_start_without_graphs():
    model = build(dict(max_graphs=3, warmup=2))
    model.feature_graphs._graphs["stands for a graph"] = None
    # (e2cnn's modules themselves cannot be pickled: the graphs alone)
    for graphs in (copy.deepcopy(model).feature_graphs, pickle.loads(pickle.dumps(model.feature_graphs))):
        assert graphs is not model.feature_graphs and len(graphs) == 0
        assert (graphs.max_graphs, graphs.warmup) == (3, 2)


def test_cpu_input_runs_eagerly():
    model = build(True)
    model.train()
    x = torch.randn(2, 3, 64, 64)
    assert model.feature_graphs(model.backbone, model.neck, x) is None
    eager = build()
    eager.train()
    for a, b in zip(features(model, x), features(eager, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _StandIn:
    """A captured graph's stand-in on the CPU: its capture runs the warm-up like the real one,
    its replay runs the modules; counts captures (the caching logic is what is tested here)."""
    captures = 0

    def __init__(self, net, x, warmup):
        type(self).captures += 1
        for _ in range(warmup):
            net(x)
        self.net = net

    def busy(self):
        return False

    def __call__(self, x):
        return tuple(self.net(x))


@pytest.fixture
def stand_ins(monkeypatch):
    from redet_plugin.cuda_graphs import feature_graphs
    monkeypatch.setattr(feature_graphs, "_ForwardGraph", _StandIn)
    monkeypatch.setattr(feature_graphs, "_TrainingGraph", _StandIn)
    monkeypatch.setattr(FeatureGraphs, "_usable", staticmethod(lambda x: True))
    _StandIn.captures = 0
    return _StandIn


def test_one_capture_per_state_up_to_max_graphs(stand_ins):
    model = build(dict(max_graphs=2)).eval()
    graphs = model.feature_graphs
    with torch.no_grad():
        for size in (32, 32, 48, 64):
            x = torch.randn(1, 3, size, size)
            served = graphs(model.backbone, model.neck, x)
            assert (served is None) == (size == 64)  # a third shape: eager
    assert stand_ins.captures == 2 and len(graphs) == 2
    model.train()  # another state, but no room left
    with torch.no_grad():
        assert graphs(model.backbone, model.neck, torch.randn(1, 3, 32, 32)) is None


def test_a_replaced_parameter_means_a_new_capture(stand_ins):
    model = build(True).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model.feature_graphs(model.backbone, model.neck, x)
        model.feature_graphs(model.backbone, model.neck, x)
        assert stand_ins.captures == 1
        conv = model.backbone.conv1
        conv.weights = torch.nn.Parameter(conv.weights.detach().clone(),
                                          requires_grad=conv.weights.requires_grad)
        model.feature_graphs(model.backbone, model.neck, x)
    assert stand_ins.captures == 2 and len(model.feature_graphs) == 1


def test_training_iterations_reuse_one_capture(stand_ins):
    """mmengine calls model.train() before every iteration; the frozen stem keeps its filter
    tensors, so the graph's storage stays the same (frozen_stages=1, as configured)."""
    model = build(True)
    assert model.backbone.frozen_stages == 1
    x = torch.randn(2, 3, 32, 32)
    for _ in range(3):
        model.train()
        model.feature_graphs(model.backbone, model.neck, x)
    assert stand_ins.captures == 1


def test_warm_up_leaves_the_running_statistics_to_the_step(stand_ins):
    graphed, eager = build(True).train(), build().train()
    x = torch.randn(2, 3, 32, 32)
    for a, b in zip(features(graphed, x), features(eager, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert stand_ins.captures == 1
    assert_same_state(eager, graphed)  # one update each, not 1 + warm-up


def test_sync_batchnorm_and_frozen_models_run_eagerly(stand_ins):
    model = build(True).train()
    x = torch.randn(2, 3, 32, 32)
    for p in (*model.backbone.parameters(), *model.neck.parameters()):
        p.requires_grad_(False)
    assert model.feature_graphs(model.backbone, model.neck, x) is None  # (with grad: nothing to train)
    model.requires_grad_(True)
    torch.nn.SyncBatchNorm.convert_sync_batchnorm(model.backbone)
    assert model.feature_graphs(model.backbone, model.neck, x) is None
    assert stand_ins.captures == 0


class _FailingCapture(_StandIn):
    """Warms up (changing the running statistics), then fails as a capture can."""

    def __init__(self, net, x, warmup):
        super().__init__(net, x, warmup)
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_runs_eagerly_with_one_line_and_the_statistics_put_back(
        stand_ins, monkeypatch):
    from redet_plugin.cuda_graphs import feature_graphs, graph_cache
    lines = []
    monkeypatch.setattr(graph_cache, "print_log", lambda msg, **kwargs: lines.append(msg))
    monkeypatch.setattr(feature_graphs, "_TrainingGraph", _FailingCapture)
    monkeypatch.setattr(_FailingCapture, "captures", 0)
    graphed, eager = build(True).train(), build().train()
    x = torch.randn(2, 3, 32, 32)
    for _ in range(2):  # (the second call does not try again)
        for a, b in zip(features(graphed, x), features(eager, x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert _FailingCapture.captures == 1 and len(graphed.feature_graphs) == 0
    assert graphed.feature_graphs.failed.startswith("the capture failed (RuntimeError")
    assert lines == [f"cuda_graph_features: eager: {graphed.feature_graphs.failed}"]
    assert_same_state(eager, graphed)  # the warm-up's updates undone: the eager steps' alone


def test_past_max_graphs_one_line_says_why(stand_ins, monkeypatch):
    from redet_plugin.cuda_graphs import graph_cache
    lines = []
    monkeypatch.setattr(graph_cache, "print_log", lambda msg, **kwargs: lines.append(msg))
    model = build(dict(max_graphs=1)).eval()
    with torch.no_grad():
        for size in (32, 48, 64):
            model.feature_graphs(model.backbone, model.neck, torch.randn(1, 3, size, size))
    assert [line for line in lines if "eager" in line] == [
        "cuda_graph_features: eager: more than max_graphs=1 input layouts (shape, dtype, grad "
        "mode, autocast, module state); raise max_graphs to capture more"]


# ---- CUDA: graphs against eager -------------------------------------------------------------------

def assert_training_steps_match(eager, graphed, run_graphed):
    """Three SGD steps of both models (the graphed one through run_graphed) give the same
    gradients, served by one graph, and the same weights and running statistics."""
    runs = [(eager, lambda x: features(eager, x)), (graphed, run_graphed)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m, _ in runs]
    for step in range(3):
        x = seeded_input(step)
        grads = []
        for (model, run), optimizer in zip(runs, optimizers):
            model.train()
            optimizer.zero_grad()
            total(run(x)).backward()
            grads.append([p.grad for p in model.backbone.parameters()])
            optimizer.step()
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, **TOL)
    assert len(graphed.feature_graphs) == 1  # (served by the graph, not eagerly)
    assert_same_state(eager, graphed)  # weights, running statistics, batches tracked


@pytest.mark.cuda
def test_training_steps_match_eager():
    eager, graphed = build(device="cuda"), build(True, device="cuda")
    assert_training_steps_match(eager, graphed, lambda x: features(graphed, x))


class _Features(torch.nn.Module):
    """A detector's backbone + neck as a module to wrap in DDP."""

    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def forward(self, x):
        return features(self.detector, x)


@pytest.mark.cuda
def test_training_under_ddp_matches_eager(tmp_path):
    """DDP keeps every parameter's gradient accumulator from its construction, on the default
    stream. A capture that accumulated into them failed (tools/dist_train.sh: "operation would make
    the legacy stream depend on a capturing blocking stream"). DDP sets them up at world size 1 too."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        eager, graphed = build(device="cuda"), build(True, device="cuda")
        ddp = torch.nn.parallel.DistributedDataParallel(
            _Features(graphed), device_ids=[torch.cuda.current_device()],
            find_unused_parameters=True)  # (the heads get no gradient here)
        assert_training_steps_match(eager, graphed, ddp)
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
def test_detector_loss_and_predict_match_eager():
    results = []
    for graphs in (False, True):
        model = build(graphs, device="cuda")
        model.train()
        x = seeded_input(1, size=128)
        samples = [s.to("cuda") for s in make_samples()]
        torch.manual_seed(3)  # (the samplers draw)
        losses = model.loss(x, samples)
        loss = sum(v.sum() if isinstance(v, torch.Tensor) else sum(v)
                   for k, v in losses.items() if "loss" in k)
        loss.backward()
        model.eval()
        with torch.no_grad():
            pred = model.predict(x, samples)[0].pred_instances
        results.append((loss.detach(), model.backbone.conv1.weights.grad, pred.bboxes, pred.scores))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.cuda
def test_eval_forward_match_and_new_shapes():
    model, eager = build(dict(max_graphs=2), device="cuda"), build(device="cuda")
    model.eval()
    eager.eval()
    with torch.no_grad():
        for size in (64, 96, 64, 128):  # (128, a third shape, is past max_graphs: eager)
            x = torch.randn(1, 3, size, size, device="cuda")
            for a, b in zip(features(model, x), features(eager, x)):
                torch.testing.assert_close(a, b, **TOL)
    assert len(model.feature_graphs) == 2


@pytest.mark.cuda
def test_replaced_tensors_are_recaptured():
    model, eager = build(True, device="cuda"), build(device="cuda")
    model.eval()
    x = torch.randn(1, 3, 64, 64, device="cuda")
    with torch.no_grad():
        features(model, x)
        model.double()  # new parameter storage: the old graph would read freed memory
        eager.double().eval()
        for a, b in zip(features(model, x.double()), features(eager, x.double())):
            torch.testing.assert_close(a, b, **TOL)
        with torch.no_grad():  # new weights loaded in place: the same graph reads them
            for p in model.parameters():
                p.mul_(0.5)
            for p in eager.parameters():
                p.mul_(0.5)
        model.train().eval()
        eager.train().eval()  # (the eval filter caches are rebuilt: new buffers, a new capture)
        for a, b in zip(features(model, x.double()), features(eager, x.double())):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.cuda
def test_two_forwards_before_one_backward():
    model, eager = build(True, device="cuda"), build(device="cuda")
    grads = []
    for m in (model, eager):
        m.train()
        (total(features(m, seeded_input(1))) + 2 * total(features(m, seeded_input(2)))).backward()
        grads.append([p.grad for p in m.backbone.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.cuda
def test_backward_after_a_newer_replay_raises():
    model = build(True, device="cuda")
    model.train()
    x = torch.randn(2, 3, 64, 64, device="cuda")
    first = total(features(model, x))
    first.backward(retain_graph=True)
    total(features(model, x)).backward()  # the graph replayed again
    with pytest.raises(RuntimeError, match="backward through backbone features of an earlier step"):
        first.backward()


@pytest.mark.cuda
def test_a_failed_capture_runs_eagerly_and_leaves_random_numbers_working():
    model, eager = build(True, device="cuda"), build(device="cuda")

    def read_back(module, args, outputs):  # legal eagerly, impossible inside a capture
        float(outputs[0].sum())

    model.neck.register_forward_hook(read_back)
    model.eval()
    eager.eval()
    x = torch.randn(1, 3, 64, 64, device="cuda")
    with torch.no_grad():
        for a, b in zip(features(model, x), features(eager, x)):
            torch.testing.assert_close(a, b, **TOL)
    assert model.feature_graphs.failed.startswith("the capture failed")
    assert len(model.feature_graphs) == 0
    torch.rand(4, device="cuda")  # the default generator is not left capturing


@pytest.mark.cuda
def test_autocast_matches_eager_autocast():
    model, eager = build(True, device="cuda"), build(device="cuda")
    outputs = []
    for m in (model, eager):
        m.train()
        with torch.autocast("cuda", dtype=torch.float16):
            out = features(m, seeded_input(1))
        total(out).backward()
        outputs.append([*out, *(p.grad for p in m.backbone.parameters())])
    for a, b in zip(*outputs):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)
