"""benchmarks/deploy/bench_compiled_package.py on the CPU: the model and the exported program
timed on the same weights and images, detecting alike, and its page section from the JSON."""
import json

from benchmarks import make_performance_doc
from benchmarks.deploy import bench_compiled_package

TINY = 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py'


def test_bench_times_the_model_and_the_program_on_the_same_weights(tmp_path):
    out = tmp_path / 'compiled_package.json'
    bench_compiled_package.main(['--out', str(out), '--config', TINY, '--data-root',
                                 str(tmp_path / 'data'), '--image-size', '96', '--images', '2',
                                 '--warmup', '1', '--device', 'cpu',
                                 '--runs', 'test_step', 'program'])
    result = json.loads(out.read_text())
    runs = result['runs']
    assert set(runs) == {'test_step', 'program'}
    assert runs['test_step']['detections'] == runs['program']['detections']  # (same weights)
    assert all(run['ms_per_image'] > 0 for run in runs.values())
    assert result['ratios']['program_speedup_over_test_step'] > 0
    assert result['goals'] == {'compiled_at_least_1_5x_test_step': None}  # (not run)
    text = '\n'.join(make_performance_doc.compiled_package(str(out), result))
    assert 'the exported program' in text and 'not measured' in text
