"""docs/performance.md is what benchmarks/make_performance_doc.py writes from benchmarks/results,
and README.md quotes its summary table as generated (the script runs as a command: tests import
nothing from benchmarks/)."""
import json
import os.path as osp
import shutil
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = osp.join(ROOT, 'benchmarks', 'make_performance_doc.py')
RESULTS = osp.join(ROOT, 'benchmarks', 'results')
START, END = '<!-- summary table: generated -->', '<!-- end of summary table -->'


def generate(tmp_path, results=RESULTS):
    out = tmp_path / 'performance.md'
    run = subprocess.run([sys.executable, SCRIPT, '--results', str(results), '--out', str(out)],
                         capture_output=True, text=True)
    return run, (out.read_text(encoding='utf-8') if run.returncode == 0 else None)


def summary_block(text):
    assert text.count(START) == 1 and text.count(END) == 1
    return text[text.index(START):text.index(END) + len(END)]


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def test_committed_page_is_generated_from_committed_results(tmp_path):
    run, text = generate(tmp_path)
    assert run.returncode == 0, run.stderr
    assert read(osp.join(ROOT, 'docs', 'performance.md')) == text, (
        'docs/performance.md is stale: run python benchmarks/make_performance_doc.py')


def test_readme_quotes_the_generated_summary(tmp_path):
    _, text = generate(tmp_path)
    assert summary_block(read(osp.join(ROOT, 'README.md'))) == summary_block(text), (
        "README.md's speed table differs from docs/performance.md's summary: copy it from there")


def test_page_follows_the_data(tmp_path):
    results = tmp_path / 'results'
    shutil.copytree(RESULTS, results)
    path = results / 'riroi_align_rotated_h200.json'
    data = json.loads(path.read_text())
    row = next(r for r in data['results'] if r['dtype'] == 'float32' and 'mmcv_forward_ms' in r)
    row['ours_forward_ms'], row['mmcv_forward_ms'] = 0.5, 1.75
    path.write_text(json.dumps(data))
    run, text = generate(tmp_path, results)
    assert run.returncode == 0, run.stderr
    assert '| 0.500 / ' in summary_block(text) and '3.50× / ' in summary_block(text)


def test_the_models_test_time_is_compared_with_mmrotates_where_recorded(tmp_path):
    results = tmp_path / 'results'
    shutil.copytree(RESULTS, results)
    path = results / 'detector_vs_mmrotate_h200.json'
    data = json.loads(path.read_text())
    data['runs']['mmrotate']['test']['model_s_per_image'] = 0.088
    data['runs']['ours_graph_cl']['test']['model_s_per_image'] = 0.011
    path.write_text(json.dumps(data))
    run, text = generate(tmp_path, results)
    assert run.returncode == 0, run.stderr
    line = next(line for line in text.splitlines() if line.startswith("The model's time"))
    assert 'mmrotate 0.0880 s' in line and '0.0110 (8.00×)' in line


def test_unread_or_duplicate_results_are_errors(tmp_path):
    results = tmp_path / 'results'
    shutil.copytree(RESULTS, results)
    (results / 'experiment_h200.json').write_text('{}')
    run, _ = generate(tmp_path, results)
    assert run.returncode != 0 and 'experiment_h200.json' in run.stderr
    (results / 'experiment_h200.json').unlink()
    shutil.copy(results / 'roi_pool_h200.json', results / 'roi_pool_a100.json')
    run, _ = generate(tmp_path, results)
    assert run.returncode != 0 and 'roi_pool_a100.json' in run.stderr
