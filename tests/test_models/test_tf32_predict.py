"""ReDet's `tf32_predict`: a test forward on a GPU runs its float32 matrix products in TF32 while
cuDNN's float32 convolutions do, and leaves torch's setting as it was; graphs are keyed by it."""
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.cuda_graphs import PredictGraphs
from redet_plugin.utils.precision import tf32_matmuls, tf32_settings
from tests._helpers import full_fp32, make_samples, tiny_detector


@pytest.fixture
def matmul_tf32_off():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def test_tf32_matmuls_sets_the_flag_for_the_block_only(matmul_tf32_off):
    with tf32_matmuls(False):
        assert not torch.backends.cuda.matmul.allow_tf32
    with tf32_matmuls(True):
        assert torch.backends.cuda.matmul.allow_tf32
        assert tf32_settings() == (torch.backends.cudnn.allow_tf32, True)
    assert not torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError, match='inside'):
        with tf32_matmuls(True):
            raise RuntimeError('inside')
    assert not torch.backends.cuda.matmul.allow_tf32


def test_the_option_is_a_bool_named_in_the_error():
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from tests._helpers import tiny_model_cfg
    register_all_modules(init_default_scope=True)
    with pytest.raises(TypeError, match="tf32_predict: expected True or False, got 'yes'"):
        MODELS.build(dict(tiny_model_cfg(), tf32_predict='yes'))


def _matmul_tf32_seen(model, device):
    """torch's matmul TF32 flag as the last R-CNN head's linear layer runs in a test forward."""
    seen = []
    layer = model.roi_head.bbox_head[-1].fc_cls
    handle = layer.register_forward_pre_hook(
        lambda *_: seen.append(torch.backends.cuda.matmul.allow_tf32))
    try:
        with torch.no_grad():
            model.predict(torch.randn(2, 3, 128, 128, device=device),
                          [s.to(device) for s in make_samples()])
    finally:
        handle.remove()
    assert seen
    return set(seen)


def test_a_cpu_forward_leaves_the_flag_alone(matmul_tf32_off):
    model = tiny_detector().eval()
    model.tf32_predict = True
    assert not model.predict_matmuls_in_tf32('cpu')
    assert _matmul_tf32_seen(model, 'cpu') == {False}
    assert not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.cuda
def test_gpu_forward_follows_cudnn_and_each_setting_has_its_graph(matmul_tf32_off):
    model = tiny_detector('cuda').eval()
    model.test_cfg.rcnn.score_thr = 0.0
    assert _matmul_tf32_seen(model, 'cuda') == {False}  # (the option is off by default)
    model.tf32_predict = True
    assert torch.backends.cudnn.allow_tf32
    assert model.predict_matmuls_in_tf32('cuda')
    assert _matmul_tf32_seen(model, 'cuda') == {True}
    assert not torch.backends.cuda.matmul.allow_tf32
    with full_fp32():
        assert not model.predict_matmuls_in_tf32('cuda')
        assert _matmul_tf32_seen(model, 'cuda') == {False}
    # captured: a graph per setting (a replay keeps the kernels of its capture)
    model.predict_graphs = PredictGraphs(max_graphs=4)
    for _ in range(2):
        _matmul_tf32_seen(model, 'cuda')
        with full_fp32():
            _matmul_tf32_seen(model, 'cuda')
    assert len(model.predict_graphs) == 2
