"""ReDet's `cuda_graph_predict`: the whole test forward replayed as one CUDA graph.

CPU: the option and the eager fallback. GPU: replays give the eager detections, wait only for
the final cut, and capture again when a parameter is replaced.
"""
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.cuda_graphs import PredictGraphs
from tests._helpers import make_samples, tiny_detector


@pytest.fixture
def log_lines(monkeypatch):
    from redet_plugin.cuda_graphs import graph_cache
    lines = []
    monkeypatch.setattr(graph_cache, 'print_log', lambda msg, **kwargs: lines.append(msg))
    return lambda: list(lines)


def _detector(device='cpu', **options):
    model = tiny_detector(device).eval()
    model.predict_graphs = PredictGraphs(**options)
    model.test_cfg.rcnn.score_thr = 0.0  # detections from random weights
    return model


def _inputs(device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 128, 128, generator=g).to(device)


def _samples(device):
    return [s.to(device) for s in make_samples(num_boxes=(3, 5))]


def _same_detections(ours, ref):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        a, b = a.pred_instances, b.pred_instances
        assert set(a.keys()) == set(b.keys()) == {'bboxes', 'scores', 'labels'}
        assert len(a) == len(b) > 0
        torch.testing.assert_close(a.bboxes, b.bboxes, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-5, atol=1e-6)
        assert torch.equal(a.labels, b.labels)


def test_option_and_arguments():
    with pytest.raises(ValueError, match='cuda_graph_predict: max_graphs must be an int >= 1'):
        PredictGraphs(max_graphs=0)
    assert len(PredictGraphs()) == 0


def test_cpu_forward_runs_eagerly_with_one_line(log_lines):
    model = _detector()
    plain = tiny_detector().eval()
    plain.test_cfg.rcnn.score_thr = 0.0
    with torch.no_grad():
        for seed in range(2):
            _same_detections(model.predict(_inputs('cpu', seed), _samples('cpu')),
                             plain.predict(_inputs('cpu', seed), _samples('cpu')))
    assert log_lines() == ['cuda_graph_predict: eager: the inputs are not on a CUDA device']


@pytest.mark.cuda
def test_replays_give_the_eager_detections_and_wait_only_for_the_cut(log_lines):
    from redet_plugin.testing import record_host_syncs
    model = _detector('cuda')
    with torch.no_grad():
        for seed in range(3):  # eager (caches), capture + replay, replay
            model.predict(_inputs('cuda', seed), _samples('cuda'))
        assert model.predict_graphs.failed is None, model.predict_graphs.failed
        assert len(model.predict_graphs) == 1
        assert any('captured a test forward' in line for line in log_lines())
        inputs, samples = _inputs('cuda', 7), _samples('cuda')
        syncs = record_host_syncs(lambda: model.predict(inputs, samples))
        graphed = model.predict(inputs, _samples('cuda'))
        model.predict_graphs = None
        eager = model.predict(inputs, _samples('cuda'))
    assert [s['site'].split(':')[0] for s in syncs] == [
        'redet_plugin/structures/padded_results.py'], syncs
    _same_detections(graphed, eager)


@pytest.mark.cuda
def test_new_weights_are_captured_again():
    model = _detector('cuda')
    with torch.no_grad():
        for seed in range(3):
            model.predict(_inputs('cuda', seed), _samples('cuda'))
        old = next(iter(model.predict_graphs._graphs.values()))[1]
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        model.roi_head.bbox_head[1].fc_cls.bias = torch.nn.Parameter(
            model.roi_head.bbox_head[1].fc_cls.bias + 1)  # a replaced parameter
        graphed = model.predict(_inputs('cuda', 9), _samples('cuda'))
        assert next(iter(model.predict_graphs._graphs.values()))[1] is not old
        predict_graphs, model.predict_graphs = model.predict_graphs, None
        eager = model.predict(_inputs('cuda', 9), _samples('cuda'))
        model.predict_graphs = predict_graphs
    _same_detections(graphed, eager)
