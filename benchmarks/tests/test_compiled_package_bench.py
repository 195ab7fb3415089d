"""benchmarks/deploy/bench_compiled_package.py on the CPU: the model and the exported program
timed on the same weights and images, detecting alike, and its page section from the JSON."""
import json

from benchmarks import make_performance_doc
from benchmarks.deploy import bench_compiled_package

TINY = 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py'


def run_bench_on_the_cpu(tmp_path, images, warmup, runs):
    """The bench's JSON after it ran `runs` with the tiny config on 96² images on the CPU."""
    out = tmp_path / 'compiled_package.json'
    bench_compiled_package.main(['--out', str(out), '--config', TINY, '--data-root',
                                 str(tmp_path / 'data'), '--image-size', '96', '--images',
                                 str(images), '--warmup', str(warmup), '--device', 'cpu',
                                 '--runs', *runs])
    return json.loads(out.read_text())


def test_bench_times_the_model_and_the_program_on_the_same_weights(tmp_path):
    result = run_bench_on_the_cpu(tmp_path, 2, 1, ['test_step', 'program'])
    runs = result['runs']
    assert set(runs) == {'test_step', 'program'}
    assert runs['test_step']['detections'] == runs['program']['detections']  # (same weights)
    assert all(run['ms_per_image'] > 0 for run in runs.values())
    assert runs['program']['cuda_graph'] is False  # (the CPU)
    assert result['ratios']['program_speedup_over_test_step'] > 0
    assert result['goals'] == {'compiled_at_least_1_5x_test_step': None}  # (not run)
    text = '\n'.join(make_performance_doc.compiled_package('x.json', result))
    assert 'the exported program' in text and 'not measured' in text


def test_mmrotates_test_run_reads_the_timed_images_with_its_initialisation(tmp_path):
    """The mmrotate_test run's config reads exactly the timed images' labels (header lines off),
    and its initial checkpoint is mmrotate's ReDet, with its data set's classes."""
    import torch
    from mmengine.config import Config
    from mmrotate.registry import MODELS

    from benchmarks._initial_checkpoint import save_initial_checkpoint
    from benchmarks.detector.bench_detector_vs_mmrotate import write_peer_labels
    from redet_plugin.datasets import generate_synthetic_dota
    from tests._helpers import register_mmrotate
    register_mmrotate()
    root = str(tmp_path / 'data')
    generate_synthetic_dota(root, num_train=1, num_val=4, image_size=96, progress=False)
    paths = bench_compiled_package.timed_paths(root, 96, 3)
    stems = sorted({p.rsplit('/', 1)[1][:-4] for p in paths})
    annfiles = str(tmp_path / 'annfiles')
    write_peer_labels(f'{root}/val', annfiles, set(stems))
    assert sorted(p.name[:-4] for p in (tmp_path / 'annfiles').iterdir()) == stems == [
        p.rsplit('/', 1)[1][:-4] for p in paths]
    for label in (tmp_path / 'annfiles').iterdir():
        assert not label.read_text().startswith(('imagesource:', 'gsd:'))
    config = tmp_path / 'mmrotate.py'
    config.write_text(bench_compiled_package.mmrotate_config_text(root, annfiles + '/'))
    cfg = Config.fromfile(str(config))
    dataset = cfg.test_dataloader.dataset
    assert (dataset.type, dataset.ann_file, dataset.data_root + dataset.data_prefix.img_path) == (
        'DOTADataset', annfiles + '/', f'{tmp_path}/data/val/images/')
    assert cfg.default_hooks.logger.interval == 1 and cfg.log_processor.window_size == 1
    checkpoint = str(tmp_path / 'initial.pth')
    save_initial_checkpoint(str(config), checkpoint)
    saved = torch.load(checkpoint, weights_only=True)
    assert len(saved['meta']['dataset_meta']['classes']) == 15
    with MODELS.switch_scope_and_registry('mmrotate') as models:
        model = models.build(cfg.model)
    model.load_state_dict(saved['state_dict'], strict=True)
    assert type(model.backbone).__module__.startswith('mmrotate')  # (its ReResNet)


def test_mmrotates_test_run_is_refused_on_the_cpu_and_the_others_still_run(tmp_path):
    runs = run_bench_on_the_cpu(tmp_path, 1, 0, ['mmrotate_test', 'test_step'])['runs']
    assert 'no CPU kernel' in runs['mmrotate_test']['error']
    assert runs['test_step']['ms_per_image'] > 0


def test_the_page_sets_the_package_against_mmrotates_test(tmp_path):
    result = dict(
        settings=dict(config='c.py', trained_checkpoint=True, mmrotate_trained_checkpoint=True,
                      image_size=1024, images=20, warmup=3, device='cuda'),
        runs=dict(test_step=dict(ms_per_image=18.0),
                  compiled=dict(ms_per_image=10.0, detections=[2000, 1999, 2001],
                                cuda_graph=True),
                  mmrotate_test=dict(ms_per_image=90.0, end_to_end_ms_per_image=150.0)),
        ratios=dict(compiled_speedup_over_test_step=1.8, compiled_speedup_over_mmrotate_test=9.0,
                    test_step_speedup_over_mmrotate_test=5.0))
    text = '\n'.join(make_performance_doc.compiled_package('x.json', result))
    assert "mmrotate's test.py in the same run" in text and 'trained by mmrotate' in text
    cells = {line.split(' | ')[0]: line.split(' | ')[1:] for line in text.splitlines()}
    dash = make_performance_doc.DASH
    assert cells['| the AOTInductor package (`tools/export.py --compile`)'] == [
        '10.0', dash, '1.80×', '9.00×', '2000 |']
    assert cells['| the model as `tools/test.py` and `tools/infer.py` run it (the config\'s '
                 'defaults)'] == ['18.0', dash, dash, '5.00×', dash + ' |']
    assert "end to end, its loader's wait included: 150 ms / image" in text
    assert ('The AOTInductor package ran as loaded by `redet_plugin.deploy.load`, replayed as one '
            'CUDA graph') in text
