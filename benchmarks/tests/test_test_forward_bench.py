"""bench_test_forward on the CPU: each path is built as tools/test.py runs it, and the runs time
the same images. Its numbers come from a GPU (benchmarks/results)."""
import json

import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from benchmarks._initial_checkpoint import save_initial_checkpoint
from benchmarks.detector import bench_test_forward
from redet_plugin.datasets import generate_synthetic_dota
from redet_plugin.models.layers.equivariant import EquivariantNetwork

from .test_profiling_tools import TINY


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('test_forward')
    root = str(tmp / 'syn')
    generate_synthetic_dota(root, num_train=0, num_val=2, image_size=96, progress=False)
    checkpoint = str(tmp / 'tiny.pth')
    save_initial_checkpoint(TINY, checkpoint)
    return root, checkpoint, tmp


@pytest.mark.parametrize('name', ['equivariant_fp32', 'plain_fp32', 'plain_tf32'])
def test_each_path_is_the_model_tools_test_runs(setup, name):
    root, checkpoint, _ = setup
    args = bench_test_forward.parse_args(['--config', TINY, '--checkpoint', checkpoint,
                                          '--data-root', root, '--device', 'cpu', '--out', 'x'])
    model = bench_test_forward.build_path(bench_test_forward.load_config(args), args, name)
    networks = [m for m in model.modules() if isinstance(m, EquivariantNetwork)]
    assert networks and all(m.exported == (name != 'equivariant_fp32') for m in networks)
    assert model.tf32_predict == (name == 'plain_tf32') and not model.training
    saved = torch.load(checkpoint, weights_only=True)['state_dict']
    key = next(k for k in saved if k.startswith('rpn_head.') and k.endswith('weight'))
    assert torch.equal(model.state_dict()[key], saved[key])  # (the checkpoint is loaded)


def test_the_paths_time_the_same_images(setup):
    root, checkpoint, tmp = setup
    out = tmp / 'forward.json'
    result = bench_test_forward.main([
        '--config', TINY, '--checkpoint', checkpoint, '--data-root', root, '--device', 'cpu',
        '--images', '3', '--rounds', '2', '--warmup', '1',
        '--paths', 'equivariant_fp32', 'plain_fp32', '--out', str(out)])
    assert json.loads(out.read_text()) == result
    runs = result['runs']
    assert set(runs) == {'equivariant_fp32', 'plain_fp32'}
    first = runs['equivariant_fp32']
    assert result['first'] == 'equivariant_fp32'
    assert first['speedup_vs_first'] == 1.0 and first['mAP_minus_first'] == 0
    assert first['matched_to_first'] == 1.0
    for run in runs.values():
        assert len(run['rounds_ms']) == 2 and run['ms_per_image'] > 0
        assert 0 <= run['mAP'] <= 1
    # plain convolutions compute the same detections (the same boxes, up to float rounding)
    assert runs['plain_fp32']['matched_to_first'] > 0.95
    assert abs(runs['plain_fp32']['mAP_minus_first']) <= 0.002


def test_each_paths_detections_are_its_own(setup, tmp_path):
    """The paths run the same batches, whose samples each test step writes its detections into:
    one path's detections must not become another's."""
    root, checkpoint, _ = setup
    other = str(tmp_path / 'other.pth')
    save_initial_checkpoint(TINY, other, seed=1)
    args = bench_test_forward.parse_args(['--config', TINY, '--checkpoint', checkpoint,
                                          '--data-root', root, '--device', 'cpu', '--out', 'x'])
    cfg = bench_test_forward.load_config(args)
    batches, _ = bench_test_forward.val_batches(cfg, 2)
    first = bench_test_forward.detections(
        bench_test_forward.build_path(cfg, args, 'plain_fp32'),
        bench_test_forward.step_args(args, 'plain_fp32'), batches)
    boxes = [bench_test_forward.as_tensors(sample)[0].clone() for sample in first]
    args.checkpoint = other
    second = bench_test_forward.detections(
        bench_test_forward.build_path(cfg, args, 'plain_fp32'),
        bench_test_forward.step_args(args, 'plain_fp32'), batches)
    for sample, before in zip(first, boxes):
        assert torch.equal(bench_test_forward.as_tensors(sample)[0], before)
    assert bench_test_forward.matched_share(first, first) == 1.0
    assert bench_test_forward.matched_share(second, first) < 0.5  # (other weights)


def test_amp_is_left_out_on_the_cpu_and_refused_when_asked_for():
    args = bench_test_forward.parse_args(['--checkpoint', 'c', '--device', 'cpu', '--out', 'x'])
    assert args.paths == ['equivariant_fp32', 'plain_fp32', 'plain_tf32']
    with pytest.raises(SystemExit):
        bench_test_forward.parse_args(['--checkpoint', 'c', '--device', 'cpu', '--out', 'x',
                                       '--paths', 'plain_amp'])
