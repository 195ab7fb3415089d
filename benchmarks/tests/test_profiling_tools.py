"""The detector's benchmark and profiling tools on the CPU: their arguments build the profiled
model, the profile runs end to end on the tiny config, and each benchmark run gets its options.
Their numbers come from a GPU (benchmarks/results); here only that they run."""
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from benchmarks._initial_checkpoint import save_initial_checkpoint
from benchmarks.profiling import list_host_syncs, profile_detector
from redet_plugin.datasets import generate_synthetic_dota

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('profiling') / 'syn')
    generate_synthetic_dota(root, num_train=2, num_val=2, image_size=96, progress=False)
    return root


@pytest.mark.parametrize('flags', [[], ['--eager'], ['--captured'], ['--channels-last'],
                                   ['--no-channels-last']])
def test_list_host_syncs_arguments_build_the_profiled_model(flags, data_root):
    with pytest.MonkeyPatch.context() as monkeypatch:  # (it refuses to run without a GPU)
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        args = list_host_syncs.parse_args(['--out', 'unused.json', '--config', TINY,
                                           '--data-root', data_root] + flags)
    args.device = 'cpu'
    cfg, model, _, loaders = profile_detector.build(args)
    # (the tiny config captures the step and the test forward, as every ReDet config does)
    assert (model.step_graphs is not None) == ('--eager' not in flags)
    assert (model.predict_graphs is not None) == ('--eager' not in flags)
    graphs_off = '--eager' in flags or '--captured' in flags
    assert (model.feature_graphs is not None) == (not graphs_off and
                                                  bool(cfg.model.get('cuda_graph_features')))
    assert model.channels_last == ('--no-channels-last' not in flags)  # (the config's: True)
    assert set(loaders) == {'train', 'val'}


def test_profile_detector_runs_on_the_cpu(data_root, tmp_path):
    out = tmp_path / 'profile.json'
    profile_detector.main(['--out', str(out), '--config', TINY, '--data-root', data_root,
                           '--warmup', '1', '--iters', '1', '--images', '1', '--captured',
                           '--device', 'cpu'])
    result = json.loads(out.read_text())
    assert result['captured'] and result['device'] == 'cpu'
    for step in ('train', 'test'):
        assert result[step]['uninstrumented_ms'] > 0
        assert 'gpu_busy' not in result[step]  # (kernel time exists only on a GPU)


# channels_last: the option the run passes (None: none, the config's layout)
@pytest.mark.parametrize('run, amp, step_graph, channels_last', [
    ('ours', False, False, None), ('ours_amp', True, False, None),
    ('ours_amp_profile', True, False, None), ('ours_graph', False, True, False),
    ('ours_graph_amp', True, True, False), ('ours_graph_cl', False, True, True),
    ('ours_graph_amp_cl', True, True, True)])
def test_detector_bench_runs_get_their_options(run, amp, step_graph, channels_last):
    from benchmarks.detector.bench_detector_vs_mmrotate import commands
    train, test, _ = commands(run, 'cfg.py', 'work', 'work_test', 10)
    assert ('--amp' in train) == amp
    assert ('model.cuda_graph_step=True' in train) == step_graph
    assert ('model.cuda_graph_predict=True' in test) == step_graph
    for command in (train, test):
        layouts = [arg for arg in command if arg.startswith('model.channels_last=')]
        assert layouts == ([] if channels_last is None
                           else [f'model.channels_last={channels_last}'])
        assert command.count('--cfg-options') <= 1  # a second one would replace the first


@pytest.mark.parametrize('captured_map, met', [(0.609, True), (0.589, False), (0.63, False)])
def test_the_captured_map_goal_compares_with_the_eager_run(captured_map, met):
    from types import SimpleNamespace

    from benchmarks.detector.bench_detector_vs_mmrotate import comparison
    runs = dict(ours=dict(test=dict(mAP50=0.6)), ours_graph_cl=dict(test=dict(mAP50=captured_map)))
    long_enough = SimpleNamespace(iters=1000, min_iters_for_map=1000)
    assert comparison(runs, long_enough)['goals']['captured_map_within_1_point_of_eager'] is met
    too_short = SimpleNamespace(iters=60, min_iters_for_map=1000)
    assert comparison(runs, too_short)['goals']['captured_map_within_1_point_of_eager'] is None


def test_the_captured_runs_eager_test_differs_only_in_the_predict_graph_and_its_folder():
    from benchmarks.detector.bench_detector_vs_mmrotate import commands, eager_predict_command
    _, test, _ = commands('ours_graph_cl', 'cfg.py', 'work', 'work_test', 10)
    eager = eager_predict_command(test, 'work_test', 'work_test_eager')
    assert [(a, b) for a, b in zip(test, eager) if a != b] == [
        ('work_test', 'work_test_eager'),
        ('model.cuda_graph_predict=True', 'model.cuda_graph_predict=False')]


@pytest.mark.parametrize('eager_map, met', [(0.6015, True), (0.603, False), (None, None)])
def test_the_captured_test_map_goal_compares_the_same_checkpoint_tested_eagerly(eager_map, met):
    from types import SimpleNamespace

    from benchmarks.detector.bench_detector_vs_mmrotate import comparison
    runs = dict(ours_graph_cl=dict(test=dict(mAP50=0.6),
                                   test_eager_predict=dict(mAP50=eager_map)))
    goals = comparison(runs, SimpleNamespace(iters=60, min_iters_for_map=1000))['goals']
    assert goals['captured_test_map_within_0_002_of_eager'] is met


@pytest.mark.parametrize('amp_cl_step, met', [(0.0280, True), (0.0290, False)])
def test_the_captured_goals_compare_with_mmrotate_and_the_fp32_captured_step(amp_cl_step, met):
    from types import SimpleNamespace

    from benchmarks.detector.bench_detector_vs_mmrotate import comparison

    def run(step, image, reserved):
        return dict(train=dict(median_iter_time_s=step, peak_cuda_memory=dict(
            reserved_mb=reserved)), test=dict(s_per_image=image))
    runs = dict(mmrotate=run(0.25, 0.07, 5700), ours_graph_cl=run(0.042, 0.0180, 5500),
                ours_graph_amp_cl=run(amp_cl_step, 0.0120, 3300))
    runs['mmrotate']['test']['model_s_per_image'] = 0.066
    runs['ours_graph_cl']['test']['model_s_per_image'] = 0.012
    goals = comparison(runs, SimpleNamespace(iters=60, min_iters_for_map=1000))['goals']
    assert goals['train_captured_at_least_5x_mmrotate'] is True   # 5.95x
    assert goals['test_captured_at_least_4x_mmrotate_per_image'] is False  # 3.89x
    assert goals['test_captured_model_at_least_5x_mmrotate_per_image'] is True  # 5.5x
    assert goals['train_captured_peak_memory_not_above_mmrotate'] is True
    assert goals['amp_captured_at_least_1_5x_fp32'] is met  # 1.50x / 1.45x
    del runs['ours_graph_amp_cl']
    goals = comparison(runs, SimpleNamespace(iters=60, min_iters_for_map=1000))['goals']
    assert goals['amp_captured_at_least_1_5x_fp32'] is None


def test_test_summary_reads_the_models_time_without_the_wait_for_data(tmp_path):
    from benchmarks.detector.bench_detector_vs_mmrotate import test_summary
    run = tmp_path / 'test' / '20261203_000000'
    run.mkdir(parents=True)
    lines = [f'12/03 00:00:0{i} - mmengine - INFO - Epoch(test) [{10 * i}/30]    eta: 0:00:01  '
             f'time: {t:.4f}  data_time: {d:.4f}  memory: {m}'
             for i, (t, d, m) in enumerate([(0.5, 0.4, 100), (0.0120, 0.0020, 300),
                                            (0.0110, 0.0005, 200)], start=1)]
    (run / '20261203_000000.log').write_text('\n'.join(lines) + '\n')
    summary = test_summary(str(tmp_path / 'test'))
    assert summary['s_per_image'] == pytest.approx(0.0115)  # the first window is warm-up
    assert summary['model_s_per_image'] == pytest.approx((0.0100 + 0.0105) / 2)
    assert summary['peak_memory_mb'] == 300
    assert test_summary(str(tmp_path / 'test'), skip=2)['s_per_image'] == pytest.approx(0.0110)


def test_device_idle_splits_launch_gaps_from_waits():
    # (us) two overlapping kernels, a 5 us launch gap, a 100 us wait, a 20 us gap (launch)
    spans = [(200, 230), (0, 10), (5, 15), (20, 80), (180, 200), (250, 260)]
    launch_gaps, waits = profile_detector.device_idle_ms(spans)
    assert (launch_gaps, waits) == pytest.approx((0.025, 0.1))


def test_kernels_go_to_the_innermost_part_holding_their_launch():
    """kernels_by_part's attribution: by launch time, to the shortest holding range (a part inside
    'forward' wins over it; a backward op on autograd's thread falls in the waiting range)."""
    ranges = [('forward', 0, 100), ('backbone', 10, 40), ('rpn loss', 50, 90),
              ('rpn assign', 60, 70), ('backward heads', 120, 200)]
    points = [5, 20, 65, 80, 150, 110, 40]
    assert profile_detector.innermost_range(points, ranges) == [
        'forward', 'backbone', 'rpn assign', 'rpn loss', 'backward heads', 'other', 'backbone']


def test_a_run_is_kept_before_each_of_its_tests(monkeypatch, tmp_path):
    """A call cut during a run's test keeps its training; one cut during the captured run's eager
    test keeps that run's training and test."""
    from types import SimpleNamespace

    import benchmarks.detector.bench_detector_vs_mmrotate as bench
    launched, kept = [], []
    monkeypatch.setattr(bench, 'commands', lambda run, config, work_dir, test_dir, iters: (
        ['train'], ['test', test_dir], {}))

    def run_logged(cmd, *args, **kwargs):
        launched.append(cmd[0])
        return 0, 1.0  # (rc, wall s)
    monkeypatch.setattr(bench, 'run_logged', run_logged)
    monkeypatch.setattr(bench, 'train_summary', lambda *a: dict(median_iter_time_s=0.04))
    monkeypatch.setattr(bench, 'test_summary', lambda d: dict(s_per_image=0.01, mAP50=0.5))
    args = SimpleNamespace(work_root=str(tmp_path), log_dir=str(tmp_path), iters=2, skip=1,
                           timeout=10)
    result = bench.bench_run(bench.CAPTURED, args, 'config.py', 1, None,
                             lambda outcome: kept.append((list(launched), dict(outcome))))
    # kept after the training, then before the eager test
    assert [k[0] for k in kept] == [['train'], ['train', 'test']]
    assert 'train' in kept[0][1] and 'test' not in kept[0][1]
    assert kept[1][1]['test']['mAP50'] == 0.5 and 'test_eager_predict' not in kept[1][1]
    assert launched == ['train', 'test', 'test'] and result['test_eager_predict']['mAP50'] == 0.5


def test_startup_phases_runs_both_tools_to_their_first_steps(tmp_path, monkeypatch):
    """Each tool in a fresh process, its phases in order, every phase reached; an installed
    transformers (here a stand-in that leaves a mark) is not imported, as by the tools."""
    from benchmarks.profiling import startup_phases
    stand_in = tmp_path / 'site' / 'transformers'
    stand_in.mkdir(parents=True)
    (stand_in / '__init__.py').write_text(f'open({str(tmp_path / "imported")!r}, "w").close()\n')
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
        [str(tmp_path / 'site'), *filter(None, [os.environ.get('PYTHONPATH')])]))
    out = tmp_path / 'startup.json'
    result = startup_phases.main(['--cpu', '--steps', '2', '--out', str(out)])
    assert json.loads(out.read_text()) == result
    for run, step in zip(result['runs'], ('train_step', 'test_step')):
        phases = [row['phase'] for row in run['phases']]
        assert phases[0].startswith('python started') and phases[-1] == f'2 {step}s done'
        assert f'first {step} done (warm-up, captures)' in phases
        assert phases[2].startswith('import redet_plugin.mm')
        since_start = [row['since_start'] for row in run['phases']]
        assert since_start == sorted(since_start) and run['total_s'] == since_start[-1]
    assert not (tmp_path / 'imported').exists()
    assert 'backbone and neck made plain convolutions' in [
        row['phase'] for row in result['runs'][1]['phases']]


@pytest.mark.parametrize('profiler', [None, 'cprofile', 'torch'])
def test_profile_test_loop_splits_each_image_of_tools_test(tmp_path, profiler):
    """tools/test.py on the tiny config: every counted image's time split into the loop's parts,
    each part measured (the parts and the rest add up to the time per image), with the
    profiler's view of the same images."""
    from benchmarks.profiling import profile_test_loop
    out = tmp_path / 'test_loop.json'
    result = profile_test_loop.main(['--cpu', '--images', '4', '--warmup', '1',
                                     '--out', str(out)] +
                                    (['--profiler', profiler] if profiler else []))
    assert json.loads(out.read_text()) == result
    assert result['images'] == 3
    parts = result['parts_ms']
    assert list(parts)[:5] == list(profile_test_loop.PARTS)
    assert all(ms > 0 for ms in parts.values())
    assert sum(parts.values()) == pytest.approx(result['ms_per_image'], abs=0.01)
    assert parts['test_step (preprocess, launch)'] > parts['evaluator.process']
    assert result['profiler'] == profiler
    assert ('profile_own' in result) == (profiler == 'cprofile')
    assert ('torch_profile' in result) == (profiler == 'torch')
    if profiler == 'cprofile':
        assert result['profile_own'] and result['profile_cumulative'][0]['cumulative_ms'] >= \
            result['profile_cumulative'][-1]['cumulative_ms']
    elif profiler == 'torch':
        rows = result['torch_profile']
        assert rows[0]['own_host_ms'] >= rows[-1]['own_host_ms'] > 0
        assert any(row['name'].startswith('aten::') for row in rows)


def test_startup_checkpoint_has_the_classes_of_the_config_test_set(tmp_path):
    """The R50 config tests on DOTA's 15 classes (the synthetic set's 5 are among them):
    tools/test.py refuses a checkpoint saved with other classes."""
    import torch

    from benchmarks.profiling import startup_phases
    from redet_plugin.datasets.dota import DOTA_V1_CLASSES
    path = str(tmp_path / 'r50.pth')
    save_initial_checkpoint(startup_phases.R50, path)
    meta = torch.load(path, weights_only=True)['meta']
    assert meta['dataset_meta']['classes'] == tuple(DOTA_V1_CLASSES)


def test_huge_image_bench_runs_ours_on_a_mosaic(tmp_path):
    """Ours alone (mmcv's RiRoIAlignRotated, which mmrotate's ReDet needs, has no CPU kernel):
    the mosaic's ground truth, the two batch sizes and the command."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from benchmarks.detector import bench_huge_image
    from redet_plugin.datasets import SYNTHETIC_CLASSES
    root = str(tmp_path / 'syn') + '/'
    generate_synthetic_dota(root, num_train=0, num_val=4, image_size=96, progress=False)
    init_default_scope('mmdet')
    checkpoint = str(tmp_path / 'tiny.pth')
    model = MODELS.build(Config.fromfile(TINY).model)
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': SYNTHETIC_CLASSES}}}, checkpoint)
    out = tmp_path / 'huge.json'
    result = bench_huge_image.main([
        '--checkpoint', checkpoint, '--our-config', TINY, '--data-root', root, '--tiles', '2',
        '--patch-size', '96', '--patch-overlap', '32', '--repeats', '1', '--batch-size', '2',
        '--device', 'cpu', '--skip-mmrotate', '--out', str(out)])
    assert json.loads(out.read_text()) == result
    assert result['num_gts'] > 0 and set(result['runs']) == {'ours_bs1', 'ours_bs2',
                                                             'tools/infer.py'}
    for name in ('ours_bs1', 'ours_bs2'):
        run = result['runs'][name]
        assert run['median_s'] > 0 and run['decoded_median_s'] > 0 and 0 <= run['ap50'] <= 1
    assert result['opencv_read_s'] > 0 and result['our_decode_s'] > 0
    assert result['runs']['tools/infer.py']['end_to_end_s'] > 0
    # the mosaic's ground truth, as detections, is found whole
    _, shape, gts = bench_huge_image.make_mosaic(root, 2, str(tmp_path), SYNTHETIC_CLASSES)
    assert tuple(shape) == (192, 192) and result['image_size'] == [192, 192]
    assert bench_huge_image.ap50(gts['bboxes'], np.ones(len(gts['labels'])), gts['labels'], gts,
                                 len(SYNTHETIC_CLASSES)) == 1.0
    shifted = gts['bboxes'] + np.array([40, 0, 0, 0, 0], np.float32)
    assert bench_huge_image.ap50(shifted, np.ones(len(gts['labels'])), gts['labels'], gts,
                                 len(SYNTHETIC_CLASSES)) < 0.5


def _test_work_dir(root, times, data_times, map50):
    """A tools/test.py work dir as mmengine leaves it: the log of its windows and the metrics."""
    run = root / '20261207_000000'
    run.mkdir(parents=True)
    lines = [f'12/07 00:00:0{i} - mmengine - INFO - Epoch(test) [{10 * i}/30]    eta: 0:00:01  '
             f'time: {t:.4f}  data_time: {d:.4f}'
             for i, (t, d) in enumerate(zip(times, data_times), start=1)]
    (run / '20261207_000000.log').write_text('\n'.join(lines) + '\n')
    (run / '20261207_000000.json').write_text(json.dumps({'dota/mAP': map50}))
    return str(root)


def test_same_checkpoint_test_sets_our_test_against_mmrotates(tmp_path):
    from benchmarks.detector import same_checkpoint_test
    theirs = _test_work_dir(tmp_path / 'theirs', [0.5, 0.0900, 0.0920], [0.4, 0.0100, 0.0120],
                            0.8609)
    ours = _test_work_dir(tmp_path / 'ours', [0.9, 0.0090, 0.0094], [0.8, 0.0010, 0.0014], 0.8603)
    out = tmp_path / 'same.json'
    result = same_checkpoint_test.main(['--ours', ours, '--mmrotate', theirs, '--checkpoint',
                                        'iter_200.pth', '--out', str(out)])
    assert json.loads(out.read_text()) == result
    # the first window (warm-up) left out: 0.091 against 0.0092 s / image
    assert result['runs']['ours']['s_per_image'] == pytest.approx(0.0092)
    assert result['test_speedup'] == pytest.approx(round(0.091 / 0.0092, 2))
    assert result['model_speedup'] == pytest.approx(10.0)  # 0.080 against 0.0080
    assert result['mAP_minus_mmrotate'] == pytest.approx(-0.0006)
    with pytest.raises(SystemExit):  # a test that logged nothing is no measurement
        same_checkpoint_test.main(['--ours', str(tmp_path / 'none'), '--mmrotate', theirs,
                                   '--checkpoint', 'c', '--out', str(out)])
