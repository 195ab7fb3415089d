"""Writes docs/performance.md from the benchmark results in benchmarks/results/.

Every number in that page comes from the JSON files here, so the page cannot drift from the data:
tests/test_tools/test_performance_doc.py checks that the committed page is what this script writes
from the committed JSON. Each benchmark keeps one file, `<benchmark>_<device>.json` (the latest
run; git keeps the older ones). A JSON file that no section reads is an error, so a new benchmark's
results do not go unpublished. Standard library only: runs anywhere, no GPU.

    python benchmarks/make_performance_doc.py [--results DIR] [--out FILE]
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
RESULTS = osp.join(ROOT, 'benchmarks', 'results')
OUT = osp.join(ROOT, 'docs', 'performance.md')
DASH = '—'


# --- formatting ---------------------------------------------------------------------------------

def num(value):
    """A time or size with three significant digits (0.0312, 0.238, 4.11, 86.3, 5423)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return DASH
    if value == 0:
        return '0'
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f'{value:.{decimals}f}'


def ratio(peer, ours):
    """peer / ours as '2.64×' (above 1: ours is faster), or a dash when either is missing."""
    if not all(isinstance(v, (int, float)) and v > 0 for v in (peer, ours)):
        return DASH
    return f'{peer / ours:.2f}×'


def table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows]
    return '\n'.join(lines)


def environment(env):
    parts = [env.get('device') or 'an unrecorded device']
    parts += [f'{name} {env[key]}' for name, key in (('torch', 'torch'), ('CUDA', 'cuda'))
              if env.get(key)]
    return ', '.join(parts)


def not_measured(reason):
    """A run's error as the table says it (rc 124: the call's time limit cut it)."""
    return 'cut by the time limit' if str(reason).endswith('rc=124') else reason


def source(path):
    return f'Data: `benchmarks/results/{osp.basename(path)}`.'


# --- the sections, one per benchmark -----------------------------------------------------------

def riroi_align_rotated(path, d):
    layer = d['layer']
    rows, cpu = [], []
    for r in d['results']:
        if r['shape'].startswith('cpu'):
            cpu.append(f"{r['shape']}: forward {num(r.get('ours_forward_ms'))} ms, backward "
                       f"{num(r.get('ours_backward_ms'))} ms (mmcv has no CPU kernel).")
            continue
        case, dtype = r['shape'], r['dtype']
        peer_fwd = r.get('mmcv_forward_ms')
        missing = ' (mmcv: no kernel)' if 'mmcv_error' in r else ''
        rows.append([case, dtype + missing, 'forward', num(r['ours_forward_ms']),
                     num(r.get('ours_forward_channels_last_ms')), num(peer_fwd),
                     f"{ratio(peer_fwd, r['ours_forward_ms'])} / "
                     f"{ratio(peer_fwd, r.get('ours_forward_channels_last_ms'))}"])
        if 'ours_backward_ms' in r:
            peer_bwd = r.get('mmcv_backward_ms')
            rows.append([case, dtype + missing, 'backward', num(r['ours_backward_ms']), DASH,
                         num(peer_bwd), ratio(peer_bwd, r['ours_backward_ms'])])
            rows.append([case, dtype + missing, 'backward, deterministic',
                         num(r.get('ours_backward_deterministic_ms')), DASH, num(peer_bwd),
                         ratio(peer_bwd, r.get('ours_backward_deterministic_ms'))])
    intro = (f"`redet_plugin.ops.RiRoIAlignRotated` against `mmcv.ops.RiRoIAlignRotated`: "
             f"{layer['output_size']}×{layer['output_size']} bins, {layer['num_samples']} samples "
             f"per bin side, {layer['num_orientations']} orientations, spatial scale "
             f"{layer['spatial_scale']}, 256 channels. The training case runs the backward "
             f"through autograd; the test case runs the forward under `torch.no_grad()`. Our "
             f"kernels read the features channels-last: the NCHW column includes the copy into "
             f"that layout, the channels-last column takes such input as it is. The deterministic "
             f"backward runs under `torch.use_deterministic_algorithms(True)`; mmcv's "
             f"backward (atomic) is the peer of both backward rows.")
    return [intro, table(['case', 'dtype', 'pass', 'ours, NCHW (ms)', 'ours, channels-last (ms)',
                          'mmcv (ms)', 'speed-up (NCHW / channels-last)'], rows), *cpu]


def roi_pool(path, d):
    rows = []
    for r in d['results']:
        dtype = r['dtype']
        tv_fwd, mm_fwd = r.get('torchvision_forward_ms'), r.get('mmcv_forward_ms')
        ours_fwd, ours_cl = r['ours_forward_ms'], r.get('ours_forward_channels_last_ms')
        rows.append([dtype, 'forward', num(ours_fwd), num(ours_cl), num(tv_fwd), num(mm_fwd),
                     f'{ratio(tv_fwd, ours_fwd)} / {ratio(tv_fwd, ours_cl)}',
                     f'{ratio(mm_fwd, ours_fwd)} / {ratio(mm_fwd, ours_cl)}'])
        tv_bwd, mm_bwd = r.get('torchvision_backward_ms'), r.get('mmcv_backward_ms')
        for name, key in (('backward', 'ours_backward_ms'),
                          ('backward, deterministic', 'ours_backward_deterministic_ms')):
            rows.append([dtype, name, num(r.get(key)), DASH, num(tv_bwd), num(mm_bwd),
                         ratio(tv_bwd, r.get(key)), ratio(mm_bwd, r.get(key))])
    identical = all(r.get('identical_to_torchvision') for r in d['results']
                    if 'identical_to_torchvision' in r)
    intro = (f"`redet_plugin.ops.roi_pool` against `torchvision.ops.roi_pool` and "
             f"`mmcv.ops.roi_pool`: {d['shape']}. Forward on NCHW features that require grad (the "
             f"NCHW column includes our copy into channels-last; the channels-last column takes "
             f"such input), backward through autograd. A dash: the peer has no kernel for that "
             f"dtype. Outputs identical to torchvision's: {'yes' if identical else 'no'}.")
    return [intro, table(['dtype', 'pass', 'ours, NCHW (ms)', 'ours, channels-last (ms)',
                          'torchvision (ms)', 'mmcv (ms)', 'vs torchvision', 'vs mmcv'], rows)]


def depth_flow_projection(path, d):
    sizes = {r['shape']: r['size'] for r in d['results']}
    rows = []
    for p in d['paired']:
        size = sizes.get(p['shape'])
        case = f"{p['shape']} ({', '.join(str(s) for s in size)})" if size else p['shape']
        f, b = p['forward_fill_ms'], p['backward_ms']
        rows.append([case, p['flow'], 'forward + fill', num(f['ours_float32']), num(f['dain']),
                     ratio(f['dain'], f['ours_float32']), num(f.get('ours_float16')),
                     num(f.get('ours_bfloat16')), num(f.get('ours_float32_unchecked'))])
        rows.append([case, p['flow'], 'backward', num(b['ours_float32']), num(b['dain']),
                     ratio(b['dain'], b['ours_float32']), num(b.get('ours_float16')),
                     num(b.get('ours_bfloat16')), DASH])
    intro = (f"`redet_plugin.ops.depth_flow_projection` against DAIN's own CUDA kernels, built "
             f"from DAIN's source in the same run, t = {d['t']}. Sizes are (batch, 2, height, "
             f"width); flows: smooth, pan (a hole band half the image wide), incoherent (8 px "
             f"noise per pixel). Forward with hole filling on inputs without grad; backward "
             f"through autograd after the forward without filling (DAIN's training forward "
             f"does not fill). Each case's calls are timed in turns, one call of each per "
             f"round, so that a drift of the GPU moves every side of a ratio alike. DAIN has "
             f"fp32 kernels only. 'unchecked': `check_depth=False` (no depth check, no host wait).")
    return [intro, table(['size', 'flow', 'pass', 'ours fp32 (ms)', 'DAIN (ms)', 'speed-up',
                          'ours fp16 (ms)', 'ours bf16 (ms)', 'ours fp32 unchecked (ms)'], rows)]


def extractor_rows(d, ours, peers):
    """One row per case, dtype and pass: the times of ours and each peer, then its speed-ups."""
    rows = []
    for r in d['results']:
        case = f"{r['case']}: {plural(r['images'], 'image')}, {r['rois']} RoIs"
        for name, key in (('forward', 'forward'), ('forward + backward', 'forward_backward')):
            mine = r.get(f'{ours}_{key}_ms')
            theirs = [r.get(f'{peer}_{key}_ms') for peer in peers]
            rows.append([case, r['dtype'], name, num(mine), *map(num, theirs),
                         *(ratio(t, mine) for t in theirs)])
    return rows


def rotated_extractor(path, d):
    rows = extractor_rows(d, 'fused', ('loop', 'mmcv_loop'))
    intro = (f"`RedetRotatedSingleRoIExtractor` with `RedetRiRoIAlignRotated`: all FPN levels in "
             f"one fused launch, against the per-level loop over the same op (`fused=False`) and "
             f"against mmrotate's way, the loop around mmcv's RiRoIAlignRotated. {d['shape']}. "
             f"Forward includes the choice of level; forward + backward also computes the feature "
             f"gradients.")
    return [intro, table(['case', 'dtype', 'pass', 'fused (ms)', 'per-level loop (ms)',
                          "mmrotate's loop, mmcv (ms)", 'vs loop', 'vs mmrotate'], rows)]


def horizontal_extractor(path, d):
    rows = extractor_rows(d, 'fused', ('parked', 'mmdet_mmcv'))
    intro = (f"`RedetHorizontalSingleRoIExtractor` with `RedetRoIPool` (ReDet's first stage): "
             f"every RoI pooled from its own FPN level in one launch, against the same op pooling "
             f"all RoIs at every level with those of other levels parked (the extractor's way "
             f"for layers without a multi-level kernel) and against mmdet's "
             f"`SingleRoIExtractor` around mmcv's RoIPool (mmrotate's ReDet; mmcv places the "
             f"bins differently, docs/ops.md, so its features are not ours). {d['shape']}. "
             f"Forward includes the choice of level; forward + backward also computes the "
             f"feature gradients.")
    return [intro, table(['case', 'dtype', 'pass', 'one launch (ms)', 'parked levels (ms)',
                          "mmdet + mmcv (ms)", 'vs parked', 'vs mmdet + mmcv'], rows)]


def field_batch_norm(path, d):
    def cell(r, key):
        ours, peer = r[f'field_norm_{key}_ms'], r[f'e2cnn_{key}_ms']
        return f'{num(ours)} / {num(peer)} ({ratio(peer, ours)})'
    rows = [['x'.join(str(s) for s in r['shape']), r['layout'].replace('_', '-'),
             'fp16' if r['amp'] else 'fp32',
             cell(r, 'train_fwd_bwd'), cell(r, 'train_fwd'), cell(r, 'eval_fwd')]
            for r in d['results']]
    intro = ("`FieldBatchNorm` (the ReResNet's batch norm over 8-orientation regular fields) "
             "against e2cnn's `InnerBatchNorm` (cuDNN's BatchNorm3d on its (B, fields, 8, H, W) "
             "view), at the ReResNet-50's shapes for a batch of two 1024² images, through "
             "autograd, eager; fp16 means under autocast. On CUDA ours computes per channel and "
             "then per field with torch's SyncBatchNorm kernels, in either layout. Cells: "
             "ours / e2cnn in ms (speed-up).")
    return [intro, table(['shape', 'layout', 'precision', 'training forward + backward',
                          'training forward', 'eval forward'], rows)]


def re_resnet(path, d):
    rows = [[r['model'], 'fp16' if r['amp'] else 'fp32', num(r['train_step_ms']),
             num(r['train_step_peak_mb']), num(r['eval_forward_ms']),
             num(r.get('exported_eval_forward_ms'))] for r in d['rows']]
    q = d['ratios']
    intro = (f"The cost of rotation equivariance: our ReResNet-50 + ReFPN (e2cnn, 8 rotations) "
             f"against mmdet's ResNet-50 + FPN, input {'x'.join(str(s) for s in d['input'])}. "
             f"Training step = forward + backward (e2cnn expands its filters from the basis every "
             f"step); eval uses the cached filters; 'exported' runs the backbone after export to "
             f"plain convolutions.")
    after = (f"Equivariant over plain, fp32: training step "
             f"{q['train_step_ms_equivariant_over_plain']:.2f}× the time, eval forward "
             f"{q['eval_forward_ms_equivariant_over_plain']:.2f}×, exported eval forward "
             f"{q['exported_over_plain_eval_forward']:.2f}×.")
    return [intro, table(['model', 'precision', 'training step (ms)', 'training peak (MB)',
                          'eval forward (ms)', 'exported eval forward (ms)'], rows), after]


DETECTOR_RUNS = {
    'mmrotate': "mmrotate-dev's ReDet (its config and tools)",
    'mmrotate_ops': "mmrotate's config with our RoI ops (through mmrotate's tools)",
    'ours': 'ours as shipped, fp32 (whole step and test forward captured)',
    'ours_amp': 'ours as shipped, `--amp`',
    'ours_eager': 'ours, fp32, `model.cuda_graphs=False` (no CUDA graph)',
    'ours_graph': 'ours, fp32, `model.cuda_graph_step=True` (the whole step as one CUDA graph), '
                  'NCHW',
    'ours_graph_amp': 'ours, `--amp`, `model.cuda_graph_step=True`, NCHW',
    'ours_graph_cl': 'ours, fp32, `model.cuda_graph_step=True` (the whole step as one CUDA graph), '
                     'channels-last',
    'ours_graph_amp_cl': 'ours, `--amp`, `model.cuda_graph_step=True`, channels-last',
    'ours_dist2': 'ours, `tools/dist_train.sh` on 2 GPUs',
}


def amp_and_layout_ratios(runs):
    """Sentences: `--amp` against fp32 and channels-last against NCHW, where both runs exist."""
    lines = []
    for fp32_run, amp_run, what in (
            ('ours', 'ours_amp', '`--amp` against our fp32 in training'),
            ('ours_graph', 'ours_graph_amp',
             '`--amp` against our fp32 in training, whole step captured'),
            ('ours_graph_cl', 'ours_graph_amp_cl',
             '`--amp` against our fp32 in training, whole step captured, channels-last'),
            ('ours_graph', 'ours_graph_amp_cl',
             '`--amp` with channels-last against fp32 with NCHW in training, whole step captured')):
        ours = runs.get(fp32_run, {}).get('train', {})
        amp = runs.get(amp_run, {}).get('train', {})
        if ours and amp and not math.isfinite(amp.get('loss_last_logged', math.nan)):
            lines.append(f"{what}: not compared, the `--amp` run's logged losses were not "
                         f"finite.")
        elif ours and amp:
            lines.append(f"{what}: "
                         f"{ratio(ours['median_iter_time_s'], amp['median_iter_time_s'])}.")
    for nchw_run, nhwc_run in (('ours_graph', 'ours_graph_cl'),
                               ('ours_graph_amp', 'ours_graph_amp_cl')):
        nchw = runs.get(nchw_run, {}).get('train', {})
        nhwc = runs.get(nhwc_run, {}).get('train', {})
        if nchw and nhwc:
            lines.append(f"Channels-last against NCHW in training ({DETECTOR_RUNS[nhwc_run]}): "
                         f"{ratio(nchw['median_iter_time_s'], nhwc['median_iter_time_s'])}.")
    return lines


def detector_run_row(name, run, extra_cells=None, extra_columns=0):
    """A detector run's table row: s / iteration, test s / image, peak memory in training
    (allocated / reserved), mAP@0.5, the `extra_columns` cells extra_cells(name, train, test)
    gives, loss first -> last; or why the run was not measured."""
    train, test = run.get('train', {}), run.get('test', {})
    label = DETECTOR_RUNS.get(name, name)
    if not train:
        reason = run.get('skipped') or run.get('error') or 'not run'
        return [label, f'not measured ({not_measured(reason)})'] + [''] * (4 + extra_columns)
    reserved = train.get('peak_cuda_memory', {}).get('reserved_mb')
    test_cell = (num(test.get('s_per_image')) if test
                 else f"not measured ({not_measured(run.get('error'))})")
    return [label, num(train['median_iter_time_s']), test_cell,
            f"{num(train.get('peak_memory_mb'))} / {num(reserved)}",
            num(test.get('mAP50')) if test else DASH,
            *(extra_cells(name, train, test) if extra_cells else ()),
            f"{train.get('loss_first_logged', 0):.2f} → {train.get('loss_last_logged', 0):.2f}"]


def rows_against_mmrotate(runs):
    """The detector runs' table rows, each with its training and test speed-up over mmrotate's."""
    base = runs.get('mmrotate', {})
    base_iter = base.get('train', {}).get('median_iter_time_s')
    base_test = base.get('test', {}).get('s_per_image')

    def speed_ups(name, train, test):
        if name == 'mmrotate':
            return ('1', '1')
        return (ratio(base_iter, train['median_iter_time_s']),
                ratio(base_test, test.get('s_per_image')))
    return [detector_run_row(name, run, speed_ups, extra_columns=2) for name, run in runs.items()]


def detector_vs_mmrotate(path, d):
    s, runs = d['settings'], d['runs']
    rows = rows_against_mmrotate(runs)
    packages = ', '.join(f'{k} {v}' for k, v in d['environment']['packages'].items())
    intro = (f"Our ReDet R50 (ReResNet-50 + ReFPN) against mmrotate-dev's, each trained from "
             f"scratch through its project's own `tools/train.py` for {s['iters']} iterations at "
             f"batch {s['batch_per_gpu']} per GPU on the same synthetic DOTA-format set "
             f"({s['images']['train']} training images, {s['resize']}², {s['workers']} loader "
             f"workers), then tested with its own `tools/test.py` on {s['images']['val']} images. "
             f"Ours is `configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py` with the "
             f"options its row names. s / iteration: the median of the "
             f"logged windows after {s['skip']} warm-up iterations; test s / image likewise "
             f"(batch 1). Peak memory in training: allocated (mmengine's `memory` log) / reserved "
             f"(the process's peak; a CUDA graph's pool is reserved, not allocated). Packages: "
             f"{packages}.")
    after = amp_and_layout_ratios(runs)
    model_time = {name: run.get('test', {}).get('model_s_per_image') for name, run in runs.items()}
    base_model = model_time.pop('mmrotate', None)
    model_times = [f"{DETECTOR_RUNS.get(name, name)} {num(t)} ({ratio(base_model, t)})"
                   for name, t in model_time.items() if t is not None]
    if base_model is not None and model_times:
        after.append(f"The model's time per test image (the logged time less mmengine's "
                     f"`data_time`, the wait for data): mmrotate {num(base_model)} s; "
                     + '; '.join(model_times) + '.')
    for name, run in runs.items():
        test, eager = run.get('test', {}), run.get('test_eager_predict', {})
        if test.get('mAP50') is not None and eager.get('mAP50') is not None:
            after.append(f"The same checkpoint of {DETECTOR_RUNS.get(name, name)}, tested with "
                         f"the test forward eager (`model.cuda_graph_predict=False`): mAP@0.5 "
                         f"{num(eager['mAP50'])} against {num(test['mAP50'])} captured, "
                         f"{num(eager.get('s_per_image'))} s / image against "
                         f"{num(test.get('s_per_image'))}.")
    return [intro, table(['run', 's / iteration', 'test s / image', 'peak MB, allocated / reserved',
                          'mAP@0.5', 'training speed-up', 'test speed-up', 'loss first → last'],
                         rows), *after]


def hrsc_vs_mmrotate(path, d):
    """The HRSC2016 configs of both projects on generated HRSC2016-layout data: speed, and our
    mAP during training (validations every --val-interval iterations)."""
    s, runs = d['settings'], d['runs']
    rows = rows_against_mmrotate(runs)
    intro = (f"ReDet's HRSC2016 setup in both projects (ours: "
             f"`configs/redet/redet-le90_re50_refpn_3x_hrsc.py`; mmrotate-dev's "
             f"`redet-le90_re50_refpn_3x_hrsc.py`: 800 x 512, one class), each trained from "
             f"scratch through its own `tools/train.py` for {s['iters']} iterations at batch "
             f"{s['batch_per_gpu']} on the same generated HRSC2016-layout set "
             f"({s['images']['trainval']} training images, {s['images']['test']} test images, "
             f"{s['workers']} loader workers), then tested with its own `tools/test.py`. "
             f"mAP@0.5: VOC07 11 points, as ReDet reports HRSC2016. Timing as in the DOTA "
             f"comparison above.")
    parts = [intro, table(['run', 's / iteration', 'test s / image',
                           'peak MB, allocated / reserved', 'mAP@0.5', 'training speed-up',
                           'test speed-up', 'loss first → last'], rows)]
    for name, run in runs.items():
        curve = run.get('train', {}).get('map50_curve')
        if curve:
            points = ', '.join(f'{num(value)} at {step}' for step, value in curve)
            parts.append(f"mAP@0.5 of {DETECTOR_RUNS.get(name, name)} on the test images "
                         f"during training (after iterations): {points}.")
        metrics = run.get('test', {}).get('metrics', {})
        reported = [(label, metrics.get(key)) for label, key in (
            ('VOC07 AP50', 'hrsc_voc07/AP50'), ('VOC12 AP50', 'hrsc_voc12/AP50'),
            ('AP75', 'hrsc_voc07/AP75'), ('mAP 0.50:0.95', 'hrsc_voc07/mAP'))]
        if all(value is not None for _, value in reported):
            parts.append(f"{DETECTOR_RUNS.get(name, name)}, the three ways HRSC2016 is "
                         f"reported: " + ', '.join(f'{label} {num(value)}'
                                                  for label, value in reported) + '.')
    return parts


# the options the `ours` run of benchmarks/results/captured_training_h200.json was measured with
# (the bench's `ours` is the configs as shipped, which now capture the step)
EAGER_STEP_RUN = ('ours, fp32, eager step, backbone and neck as CUDA graphs '
                  '(`model.cuda_graph_features=True`)')


def captured_training(path, d):
    s, runs = d['settings'], d['runs']
    rows = []
    labels = dict(DETECTOR_RUNS, ours=EAGER_STEP_RUN)
    for name in ('ours', 'ours_graph'):
        run = runs.get(name, {})
        train, test = run.get('train', {}), run.get('test', {})
        if not train or not test:
            reason = run.get('skipped') or run.get('error') or 'not run'
            rows.append([labels.get(name, name), f'not measured ({not_measured(reason)})',
                         '', '', ''])
            continue
        reserved = train.get('peak_cuda_memory', {}).get('reserved_mb')
        rows.append([labels.get(name, name), num(train['median_iter_time_s']),
                     num(test.get('s_per_image')), num(reserved), num(test.get('mAP50'))])
    intro = (f"A training run with the whole step captured (`model.cuda_graph_step=True`, tested "
             f"with `model.cuda_graph_predict=True`) against one with the step eager and "
             f"the backbone and neck as CUDA graphs, both trained from scratch in the "
             f"same run through `tools/train.py` for {s['iters']} iterations at batch "
             f"{s['batch_per_gpu']} on the same synthetic set ({s['images']['train']} training "
             f"images, {s['resize']}²) and tested with `tools/test.py` on {s['images']['val']} "
             f"images. Times as in the section above, after {s['skip']} warm-up iterations.")
    return [intro, table(['run', 's / iteration', 'test s / image', 'peak reserved MB',
                          'mAP@0.5'], rows)]


def captured_variants(path, d):
    s = d['settings']
    rows = [detector_run_row(name, run) for name, run in d['runs'].items()]
    intro = (f"The captured step in fp32 and under `--amp`, with NCHW (`model.channels_last="
             f"False`) and with channels-last feature maps (`model.channels_last=True`, the "
             f"configs' default), trained in the same run through "
             f"`tools/train.py` for {s['iters']} iterations at batch {s['batch_per_gpu']} on the "
             f"same synthetic set ({s['images']['train']} training images, {s['resize']}²) and "
             f"tested with `tools/test.py` on {s['images']['val']} images. Times as in the "
             f"section above, after {s['skip']} warm-up iterations.")
    return [intro, table(['run', 's / iteration', 'test s / image',
                          'peak MB, allocated / reserved', 'mAP@0.5', 'loss first → last'], rows),
            *amp_and_layout_ratios(d['runs'])]


def _merge(first, second):
    """The rows of both lists, in order; a row only in `second` goes after its predecessor there."""
    merged = list(first)
    for i, row in enumerate(second):
        if row not in merged:
            at = merged.index(second[i - 1]) + 1 if i else 0
            merged.insert(at, row)
    return merged


def profile_detector(path, d):
    train, test = d['train'], d['test']
    rows_in = _merge([tuple(r) for r in train['rows']], [tuple(r) for r in test['rows']])

    def cells(side, name):
        ms = side['parts_ms'].get(name)
        if ms is None:
            return ['', '']
        return [num(ms), f"{100 * ms / side['instrumented_total_ms']:.0f}%"]
    rows = [['data loading (1 process)', num(train['data_loading_ms']), '',
             num(test['data_loading_ms']), '']]
    for name, parent in rows_in:
        label = f'&nbsp;&nbsp;{name} (in {parent})' if parent else name
        rows.append([label, *cells(train, name), *cells(test, name)])
    rows.append(['**sum of parts**', num(train['instrumented_total_ms']), '',
                 num(test['instrumented_total_ms']), ''])
    rows.append(['**step, uninstrumented**', num(train['uninstrumented_ms']), '',
                 num(test['uninstrumented_ms']), ''])
    graphs = 'as CUDA graphs' if d.get('graphs') else 'eagerly (`model.cuda_graph_features=False`)'
    weights = 'trained weights' if d.get('checkpoint') else 'random weights'
    uninstrumented = ('the uninstrumented steps, run back to back with one synchronisation at the '
                      'end as a Runner runs them, are timed beside' if 'gpu_busy' in train else
                      'the uninstrumented step is timed beside')
    if d.get('captured'):
        uninstrumented += (' (each a whole CUDA graph: `cuda_graph_step`, `cuda_graph_predict`; '
                           'the parts are timed eagerly)')
    intro = (f"Where one training iteration (batch 2) and one inference image of our R50 config "
             f"go, at {d['image_size']}², {'fp16 autocast' if d['amp'] else 'fp32'}, "
             f"{'channels-last' if d.get('channels_last') else 'NCHW'} feature maps, "
             f"{weights}, backbone and neck run {graphs}. Each part is timed with a CUDA "
             f"synchronisation before and after it, which adds a little to each; "
             f"{uninstrumented}. Medians of {d['iters']} iterations and "
             f"{d['images']} images after {d['warmup']} unmeasured ones. Data loading is one "
             f"process loading and augmenting a batch (training overlaps it with the step by the "
             f"loader's workers).")
    kernels = d.get('kernels', {})
    after = []
    if kernels:
        after.append(f"GPU kernel time within an uninstrumented step (torch.profiler): "
                     f"{num(kernels['train']['total_kernel_ms'])} ms of the training step's "
                     f"{num(train['uninstrumented_ms'])} ms, "
                     f"{num(kernels['test']['total_kernel_ms'])} ms of the inference step's "
                     f"{num(test['uninstrumented_ms'])} ms"
                     + (f" (GPU busy {100 * train['gpu_busy']:.0f}% and "
                        f"{100 * test['gpu_busy']:.0f}%)" if 'gpu_busy' in train else '')
                     + ".")
        if 'device_waits_ms' in kernels['test']:
            after.append("Where the GPU is idle within those steps: "
                         + "; ".join(f"{what}, {kernels[side]['kernels_per_call']} kernels with "
                                     f"{num(kernels[side]['launch_gaps_ms'])} ms of gaps between "
                                     f"kernels launched back to back and "
                                     f"{num(kernels[side]['device_waits_ms'])} ms waiting for "
                                     f"the host" for side, what in (('train', 'training'),
                                                                   ('test', 'inference')))
                         + ".")
    return [intro, table(['part', 'training (ms)', 'share', 'inference, 1 image (ms)', 'share'],
                         rows), *after]


def host_syncs(path, d):
    graphs = 'as CUDA graphs' if d.get('cuda_graph_features') else 'eagerly'
    if d.get('captured'):
        graphs = ('within the whole step captured as one CUDA graph (`cuda_graph_step`, '
                  '`cuda_graph_predict`: the recorded steps are replays)')
    paragraphs = [f"Host synchronisations (the host waiting for the GPU: a read-back such as "
                  f"`.item()`, or a data-dependent shape such as `nonzero()`) in one training "
                  f"step (`model.train_step`) and one test forward (`model.test_step`) of "
                  f"`{d['config']}`, {'fp16 autocast' if d['amp'] else 'fp32'}, backbone and "
                  f"neck run {graphs}, found by `torch.cuda.set_sync_debug_mode('warn')`. Each "
                  f"row is the innermost frame of the project, mmdet, mmcv or mmengine that asked "
                  f"for one; the JSON holds each site's stack."]
    for key, title in (('train_step', 'training step'), ('test_step', 'test forward')):
        step = d[key]
        rows = [[str(site['count']), f"`{site['site']}`"] for site in step['sites'][:15]]
        paragraphs.append(f"{title}: {plural(step['syncs'], 'synchronisation')} at "
                          f"{plural(len(step['sites']), 'call site')}"
                          + (' (the 15 most frequent):' if len(rows) > 14
                             else ':' if rows else '.'))
        if rows:
            paragraphs.append(table(['count', 'call site'], rows))
    if any(site['site'].endswith(' cut_padding') for site in d['test_step']['sites']):
        paragraphs.append("`cut_padding` is the one read-back that ends a test forward called as "
                          "`model.test_step`: each image's number of detections, after the "
                          "captured forward. The validation and test loops of `tools/test.py` and "
                          "`tools/train.py`, and the patch inference, read it one batch behind, "
                          "once the next batch's forward is queued, so the GPU does not wait.")
    return paragraphs


def plural(count, noun):
    return f"{count} {noun}" + ('' if count == 1 else 's')


def multi_gpu(path, d):
    t = d['side_by_side']
    speed, maps, memory = t['images_per_s'], t['mAP50'], t['peak_memory_mb']
    rows = [['1 GPU, batch 2', num(speed['1gpu_batch2']), DASH, num(memory['1gpu_batch2'])],
            ['1 GPU, batch 4', num(speed['1gpu_batch4']), num(maps['1gpu_batch4']), DASH],
            ['2 GPUs, 2 x 2 (`tools/dist_train.sh`)', num(speed['2gpu_2x2']),
             num(maps['2gpu_2x2']), num(memory['2gpu_2x2_rank0'])]]
    return [f"{d['what']}. Scaling, 2 GPUs over 1 at batch 2 each: "
            f"{num(t['scaling_2gpu_over_1gpu'])}×; mAP@0.5 difference at the same total batch: "
            f"{num(t['mAP50_2gpu_minus_1gpu'])}.",
            table(['run', 'images / s', 'mAP@0.5', 'peak memory (MB)'], rows)]


def data_loading(path, d):
    rows = [[str(r['workers']), num(r['batches_per_s']), num(r['ms_per_batch'])] for r in d['runs']]
    loader = d.get('loader', 'train_dataloader')
    step = 'training step' if loader == 'train_dataloader' else 'test step (one image a batch)'
    return [f"The `{loader}` of `{d['config']}` (batch {d['batch_size']}; the config "
            f"starts {d['config_workers']} workers), batches per second by number of worker "
            f"processes, over {d['batches']} batches once every worker has delivered its first. "
            f"A {step} must not take less than the loader's time per batch, or the GPU "
            f"waits for data.",
            table(['workers', 'batches / s', 'ms per batch'], rows)]


def step_memory(path, d):
    rows = []
    for name, result in d['results'].items():
        mode, allocator = name.split('/')
        if 'rows' not in result:
            rows.append([f'`{mode}`', allocator, '', 'failed', ''])
            continue
        last = result['rows'][-1]
        graphs = result.get('step_graphs')
        rows.append([f'`{mode}`', allocator, '' if graphs is None else str(graphs),
                     str(last['peak_allocated_mb']), str(last['peak_reserved_mb'])])
    return [f"Peak CUDA memory of training steps of `{d['config']}` (batch 2, 1024², random "
            f"weights and images; gts per image, step by step: {', '.join(map(str, d['gts']))}) "
            f"by model options (`eager`: no CUDA graphs; `feature_graphs`: backbone and neck "
            f"captured; `step_graph`: `cuda_graph_step`, gts padded to 64 or 128, two graphs; "
            f"`step_graph_one_capacity`: every batch padded to 128 gts, one graph) and allocator "
            f"setting (`expandable`: `expandable_segments:True`, as `tools/train.py` sets it; "
            f"`fixed`: torch's default).",
            table(['model', 'allocator', 'step graphs', 'peak allocated (MB)',
                   'peak reserved (MB)'], rows)]


# (title, file stem, benchmark script, renderer)
def huge_image(path, d):
    rows = []
    for name, run in d['runs'].items():
        if name == 'tools/infer.py':
            continue
        rows.append([f'`{name}`', num(run['first_s']), num(run['median_s']),
                     num(run['decoded_median_s']) if 'decoded_median_s' in run else DASH,
                     str(run['num_detections']), num(run['ap50']),
                     num(run.get('speedup_vs_mmrotate')) if 'speedup_vs_mmrotate' in run else DASH])
    command = d['runs'].get('tools/infer.py', {}).get('end_to_end_s')
    height, width = d['image_size']
    return [f"One {width} x {height} image, a mosaic of {d['tiles']} x {d['tiles']} annotated "
            f"synthetic images ({d['num_gts']} objects), detected by {d['patch_size']} patches "
            f"overlapping by {d['overlap']} and merged by a class-wise rotated NMS at IoU "
            f"{d['merge_iou_thr']}, with one mmrotate checkpoint: ours (`RotatedDetector`, what "
            f"`tools/infer.py` runs; `bs` patches a forward) against mmrotate's "
            f"`inference_detector_by_patches` (what its `demo/huge_image_demo.py` calls, one "
            f"patch a forward). The first call includes the warm-up; then the median of later "
            f"calls; ours also from the image already decoded (the model, the patches and the "
            f"merge alone). AP50 against the mosaic's objects (VOC07 11 points)." + (
                f" Decoding the image file (PNG): {num(d['opencv_read_s'])} s by OpenCV "
                f"(mmrotate's read)" + (f", {num(d['our_decode_s'])} s by ours (in bands, "
                                        f"while the patches above run)" if 'our_decode_s' in d
                                        else '') + "." if 'opencv_read_s' in d else ''),
            table(['run', 'first call (s)', 'median (s)', 'median, image decoded (s)',
                   'detections', 'AP50', 'speed-up over mmrotate'], rows)] + (
        [f"`tools/infer.py` on the image, end to end in its own process (start-up, model, "
         f"patches, writing the detections): {num(command)} s."] if command else [])


BYTECODE = {
    True: " The environment's bytecode was compiled, as pip leaves an install.",
    False: " The environment had no compiled bytecode (the GPU machine's python ships none and "
           "runs with PYTHONDONTWRITEBYTECODE=1), so every start compiled torch and the other "
           "packages from source, which a start after a pip install does not do.",
}


def startup(path, d):
    parts = [f"From `python tools/train.py` and `python tools/test.py` (`{d['config']}`, a "
             f"checkpoint of its initial weights) to the end of their first {d['steps']} steps, "
             f"each tool in a fresh process, phase by phase (a step ends at a CUDA "
             f"synchronisation)." + BYTECODE.get(d.get('bytecode_compiled'), '')]
    for run in d['runs']:
        rows = [[row['phase'], num(row['seconds']), num(row['since_start'])]
                for row in run['phases']]
        parts += [f"`tools/{run['tool']}.py`: {num(run['total_s'])} s.",
                  table(['phase', 's', 's since the start'], rows)]
    return parts


def test_loop(path, d):
    flags = [option for option in d['tool_argv'] if option.startswith('--') and
             option not in ('--work-dir', '--cfg-options')]
    model_options = [option for option in d['tool_argv'] if option.startswith('model.')]
    flags = ' '.join(flags + (['--cfg-options'] + model_options if model_options else []))
    rows = [[part, num(ms), f"{100 * ms / d['ms_per_image']:.0f}%"]
            for part, ms in d['parts_ms'].items()]
    weights = d['checkpoint'] if d['checkpoint'] == 'initial weights' else \
        f"the checkpoint `{osp.basename(d['checkpoint'])}`"
    return [f"`tools/test.py {d['config']}{' ' + flags if flags else ''}` (the config's loader, "
            f"hooks and evaluator; {weights}), {d['images']} images after {d['warmup']} "
            f"unmeasured test steps: the main process's time per image by what it is doing. A "
            f"part nested in another (the evaluator and the hooks run inside the read-back of "
            f"the image before) counts in its own row only." + (
                " An untrained head keeps many boxes in every image (up to the test's limit), so "
                "the evaluator's matching, most of the metric at the end, weighs far more than "
                "with trained weights." if d['checkpoint'] == 'initial weights' else ''),
            f"{num(d['ms_per_image'])} ms / image; the loader's wait is "
            f"{100 * d['loader_wait_share']:.0f}% of it.",
            table(['part', 'ms / image', 'share'], rows)] + _profiled_functions(d)


def same_checkpoint_test(path, d):
    rows = []
    for name, label in (('mmrotate', "mmrotate's `tools/test.py` with the config it trained "
                                     "with"),
                        ('ours', "our `tools/test.py` with "
                                 "`configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py`"
                                 " (its defaults)")):
        run = d['runs'][name]
        rows.append([label, num(run['s_per_image']), num(run['model_s_per_image']),
                     f"{run['mAP50']:.4f}" if run['mAP50'] is not None else DASH])
    return [f"One checkpoint, trained by mmrotate's own `tools/train.py` (`"
            f"{osp.basename(d['checkpoint'])}`), tested on the same annotated images by "
            f"mmrotate's `tools/test.py` and by ours, each end to end in its own process with "
            f"its own loader (batch 1). s / image: the median of the logged windows of 10 "
            f"images after the first; the model's s / image leaves out mmengine's data_time "
            f"(the wait for the loader).",
            table(['run', 's / image', "model's s / image", 'mAP@0.5'], rows),
            f"Ours against mmrotate: {num(d['test_speedup'])}× end to end, "
            f"{num(d['model_speedup'])}× the model alone" + (
                f"; mAP difference {d['mAP_minus_mmrotate']:+.4f}."
                if d['mAP_minus_mmrotate'] is not None else ".")]


TEST_PATHS = {
    'equivariant_fp32': "e2cnn's modules, float32 matrix products (the captured test forward "
                        "before the options below)",
    'plain_fp32': 'plain convolutions with folded batch norms, float32 matrix products',
    'plain_tf32': 'plain convolutions, TF32 matrix products (the default)',
    'plain_amp': 'plain convolutions, fp16 autocast',
}


def test_forward(path, d):
    first = d['first']
    rows = [[TEST_PATHS.get(name, name), f"`{run['tools_test_options']}`"
             if run['tools_test_options'].startswith('--') else run['tools_test_options'],
             num(run['ms_per_image']), f"{num(run['speedup_vs_first'])}×", f"{run['mAP']:.4f}",
             f"{run['mAP_minus_first']:+.4f}", num(run['detections_per_image']),
             f"{100 * run['matched_to_first']:.1f}%" if run['matched_to_first'] is not None
             else DASH]
            for name, run in d['runs'].items()]
    return [f"The model's time per test image by test path, `{d['config']}` with the checkpoint "
            f"`{osp.basename(d['checkpoint'])}`: each path a model of its own in one process, "
            f"its test steps run back to back as `tools/test.py` runs them (each image's "
            f"detections cut while the next runs; the loader left out), on {d['images']} "
            f"annotated images already loaded, after {d['warmup']} unmeasured ones (the CUDA "
            f"graph's capture). The paths take turns over {d['rounds']} rounds; the median "
            f"round. Speed-up and mAP difference against the first row; matched: the share of "
            f"the first row's detections found again one to one (same label, score within "
            f"1e-3, every box number within 1e-3 of the box's size). Every path runs its float32 "
            f"convolutions in TF32 (cuDNN's default); the options choose the matrix products' "
            f"precision (the R-CNN heads' linear layers).",
            table(['path', '`tools/test.py` options', 'ms / image', 'speed-up', 'mAP@0.5',
                   'mAP difference', 'detections / image', 'matched'], rows)]


def _profiled_functions(d):
    if 'profile_own' not in d:
        return []
    functions = [[f"`{row['function']}`", num(row['own_ms']), num(row['calls_per_image'])]
                 for row in d['profile_own'][:10]]
    return ["The functions with the most time of their own (cProfile over the same images, "
            "which slows the loop):",
            table(['function', 'ms / image', 'calls / image'], functions)]


PACKAGE_RUNS = {
    'test_step': "the model as `tools/test.py` and `tools/infer.py` run it (the config's defaults)",
    'program': 'the exported program (`tools/export.py`)',
    'compiled': 'the AOTInductor package (`tools/export.py --compile`)',
    'compiled_fp16': 'the same with `--dtype float16` (fp16 autocast, as `tools/test.py --amp`)',
    'mmrotate_test': "mmrotate's `tools/test.py` with its ReDet config (its model's time: the "
                     "time per image less its loader's wait)",
}


def compiled_package(path, d):
    s, runs, ratios = d['settings'], d['runs'], d['ratios']
    rows = []
    for name, label in PACKAGE_RUNS.items():
        run = runs.get(name, {})
        if 'ms_per_image' not in run:
            rows.append([label, f"not measured ({not_measured(run.get('error') or 'not run')})",
                         '', '', '', ''])
            continue
        speedups = [ratios.get(f'{name}_speedup_over_{base}')
                    for base in ('test_step', 'mmrotate_test')]
        # (untrained heads fill the NMS differently: the counts say how alike the work is)
        counts = run.get('detections')
        rows.append([label, num(run['ms_per_image']),
                     num(run.get('export_s')) if 'export_s' in run else DASH,
                     *(f'{num(x)}×' if x else DASH for x in speedups),
                     f'{sum(counts) / len(counts):.0f}' if counts else DASH])
    weights = 'a trained checkpoint' if s['trained_checkpoint'] else 'its initial weights'
    peer_weights = ('a checkpoint trained by mmrotate' if s.get('mmrotate_trained_checkpoint')
                    else 'its initial weights')
    peer_text = (f"; mmrotate's test.py in the same run, on the same images with {peer_weights}"
                 if 'mmrotate_test' in runs else '')
    parts = [f"One {s['image_size']}² image a forward, detections read back to the host, "
             f"`{s['config']}` with {weights} on {s['device']}: median over {s['images']} images "
             f"after {s['warmup']} unmeasured ones, in one process{peer_text}.",
             table(['run', 'ms / image', 'made in (s)', 'speed-up over the model',
                    "speed-up over mmrotate's test.py", 'detections / image (mean)'], rows)]
    if runs.get('compiled', {}).get('cuda_graph'):  # (a program is never replayed: see load)
        parts.append("The AOTInductor package ran as loaded by `redet_plugin.deploy.load`, "
                     "replayed as one CUDA graph (its default on a GPU).")
    if runs.get('compiled', {}).get('tf32'):
        model = ("the model too (`model.tf32_predict`)" if runs.get('test_step', {}).get('tf32')
                 else "the model in full float32 (torch's default)")
        parts.append("The packages ran their float32 matrix products (the R-CNN heads' linear "
                     f"layers) in TF32, `load`'s default on a GPU; {model}. All ran float32 "
                     "convolutions in TF32 (cuDNN's default).")
    peer = runs.get('mmrotate_test', {})
    if 'end_to_end_ms_per_image' in peer:
        parts.append(f"mmrotate's test.py end to end, its loader's wait included: "
                     f"{num(peer['end_to_end_ms_per_image'])} ms / image.")
    return parts


SECTIONS = [
    ('RiRoIAlignRotated', 'riroi_align_rotated', 'benchmarks/ops/bench_riroi_align_rotated.py',
     riroi_align_rotated),
    ('RoIPool', 'roi_pool', 'benchmarks/ops/bench_roi_pool.py', roi_pool),
    ('Depth-aware flow projection', 'depth_flow_projection',
     'benchmarks/ops/bench_depth_flow_projection.py', depth_flow_projection),
    ('Rotated RoI extractor (all FPN levels in one launch)', 'rotated_extractor',
     'benchmarks/ops/bench_rotated_extractor.py', rotated_extractor),
    ('Horizontal RoI extractor (all FPN levels in one launch)', 'horizontal_extractor',
     'benchmarks/ops/bench_horizontal_extractor.py', horizontal_extractor),
    ('FieldBatchNorm', 'field_batch_norm', 'benchmarks/ops/bench_field_batch_norm.py',
     field_batch_norm),
    ('ReResNet-50 + ReFPN against ResNet-50 + FPN', 're_resnet',
     'benchmarks/ops/bench_re_resnet.py', re_resnet),
    ('The detector against mmrotate', 'detector_vs_mmrotate',
     'benchmarks/detector/bench_detector_vs_mmrotate.py', detector_vs_mmrotate),
    ('ReDet on HRSC2016 against mmrotate', 'hrsc_vs_mmrotate',
     'benchmarks/detector/bench_detector_vs_mmrotate.py --dataset hrsc', hrsc_vs_mmrotate),
    ('Captured training against eager training', 'captured_training',
     'benchmarks/detector/bench_detector_vs_mmrotate.py --runs ours ours_graph',
     captured_training),
    ('Precision and layout of the captured step', 'captured_variants',
     'benchmarks/detector/bench_detector_vs_mmrotate.py --runs ours_graph_cl ours_graph '
     'ours_graph_amp_cl ours_graph_amp', captured_variants),
    ("Where the detector's step goes", 'profile_detector',
     'benchmarks/profiling/profile_detector.py', profile_detector),
    ("Memory of a training step", 'step_memory', 'benchmarks/profiling/step_memory.py',
     step_memory),
    ("Where the detector's step waits for the host", 'host_syncs',
     'benchmarks/profiling/list_host_syncs.py', host_syncs),
    ('The training data loader', 'data_loading', 'benchmarks/detector/bench_data_loading.py',
     data_loading),
    ('The test data loader', 'test_data_loading',
     'benchmarks/detector/bench_data_loading.py --loader val_dataloader', data_loading),
    ('Training on several GPUs', 'multi_gpu', 'benchmarks/detector/bench_multi_gpu.py',
     multi_gpu),
    ('Huge images by patches', 'huge_image', 'benchmarks/detector/bench_huge_image.py',
     huge_image),
    ('Where tools/test.py spends each image', 'test_loop',
     'benchmarks/profiling/profile_test_loop.py', test_loop),
    ('Where tools/test.py spends each image, matrix products in full float32',
     'full_fp32_test_loop',
     'benchmarks/profiling/profile_test_loop.py -- --cfg-options model.tf32_predict=False',
     test_loop),
    ('Where tools/test.py --amp spends each image', 'amp_test_loop',
     'benchmarks/profiling/profile_test_loop.py -- --amp', test_loop),
    ('tools/test.py on one mmrotate checkpoint', 'same_checkpoint_test',
     'benchmarks/detector/mmrotate_parity.sh', same_checkpoint_test),
    ('The model per test image, by test path', 'test_forward',
     'benchmarks/detector/bench_test_forward.py', test_forward),
    ('Start-up of the tools', 'startup', 'benchmarks/profiling/startup_phases.py', startup),
    ('The exported model', 'compiled_package', 'benchmarks/deploy/bench_compiled_package.py',
     compiled_package),
]


# --- the summary table (README.md quotes it) ---------------------------------------------------

def summary(data):
    """One row per benchmark against a peer: the headline case, fp32, from the same JSON."""
    rows = []
    peers = ('riroi_align_rotated', 'roi_pool', 'depth_flow_projection', 'rotated_extractor',
             'detector_vs_mmrotate')  # the rows below
    devices = sorted({(data[k].get('environment') or data[k]).get('device') for k in peers
                      if k in data} - {None})
    riroi = data.get('riroi_align_rotated')
    if riroi:
        r = next(r for r in riroi['results']
                 if r['shape'].startswith('train') and r['dtype'] == 'float32')
        rows.append(['RiRoIAlignRotated, training (1024 RoIs), forward / backward',
                     f"{num(r['ours_forward_ms'])} / {num(r['ours_backward_ms'])} ms",
                     f"mmcv {num(r['mmcv_forward_ms'])} / {num(r['mmcv_backward_ms'])} ms",
                     f"{ratio(r['mmcv_forward_ms'], r['ours_forward_ms'])} / "
                     f"{ratio(r['mmcv_backward_ms'], r['ours_backward_ms'])}"])
    pool = data.get('roi_pool')
    if pool:
        r = next(r for r in pool['results'] if r['dtype'] == 'float32')
        rows.append(['RoIPool (1024 RoIs), forward / backward',
                     f"{num(r['ours_forward_ms'])} / {num(r['ours_backward_ms'])} ms",
                     f"torchvision {num(r['torchvision_forward_ms'])} / "
                     f"{num(r['torchvision_backward_ms'])} ms",
                     f"{ratio(r['torchvision_forward_ms'], r['ours_forward_ms'])} / "
                     f"{ratio(r['torchvision_backward_ms'], r['ours_backward_ms'])}"])
    flow = data.get('depth_flow_projection')
    if flow:
        p = next(p for p in flow['paired'] if p['shape'] == '1080p' and p['flow'] == 'smooth')
        f, b = p['forward_fill_ms'], p['backward_ms']
        rows.append(['Depth-aware flow projection, 1080p, forward + fill / backward',
                     f"{num(f['ours_float32'])} / {num(b['ours_float32'])} ms",
                     f"DAIN {num(f['dain'])} / {num(b['dain'])} ms",
                     f"{ratio(f['dain'], f['ours_float32'])} / "
                     f"{ratio(b['dain'], b['ours_float32'])}"])
    extractor = data.get('rotated_extractor')
    if extractor:
        r = next(r for r in extractor['results']
                 if r['case'] == 'train' and r['dtype'] == 'float32')
        rows.append(['Rotated RoI extractor, 5 levels, training, forward + backward',
                     f"{num(r['fused_forward_backward_ms'])} ms",
                     f"mmrotate's loop {num(r['mmcv_loop_forward_backward_ms'])} ms",
                     ratio(r['mmcv_loop_forward_backward_ms'], r['fused_forward_backward_ms'])])
    detector = data.get('detector_vs_mmrotate')
    runs = detector['runs'] if detector else {}
    peer = runs.get('mmrotate', {})
    captured = next((run for run in ('ours_graph_cl', 'ours_graph') if run in runs), None)
    for run, how in (('ours', ''), (captured, ', whole step as one CUDA graph' + (
            ', channels-last' if captured == 'ours_graph_cl' else ''))):
        ours = runs.get(run, {})
        for part, key, what in (('train', 'median_iter_time_s', 'training s / iteration'),
                                ('test', 's_per_image', 'test s / image')):
            mine, theirs = (ours.get(part) or {}).get(key), (peer.get(part) or {}).get(key)
            if mine is not None and theirs is not None:
                rows.append([f'ReDet R50, {what} (batch {2 if part == "train" else 1}, '
                             f'1024²{how})', num(mine), f'mmrotate {num(theirs)}',
                             ratio(theirs, mine)])
    return table([f"what (fp32, one {' / '.join(devices) or 'GPU'})", 'ours', 'peer', 'speed-up'],
                 rows)


SUMMARY_START = '<!-- summary table: generated -->'
SUMMARY_END = '<!-- end of summary table -->'

METHOD = f"""\
# Performance

Generated by `python benchmarks/make_performance_doc.py` from the JSON in `benchmarks/results/`;
edit that script, not this page.

## Method

- **What is timed**: our public function or module, as users call it (argument checks, the
  Python face and, for the backward, autograd: `torch.autograd.grad` on inputs that require
  grad), against the peer as its users call it (mmcv's and torchvision's ops and modules, DAIN's
  kernels built from its source, mmrotate's detector through its own tools), on the same inputs
  in the same run.
- **How**: CUDA events around each call; the L2 cache flushed before every timed call (a 256 MB
  write); the GPU kept busy by a short spin kernel while the host enqueues the call, as in a
  training loop where the host runs ahead, so the numbers are GPU time; warm-up calls first;
  the median of 60 calls. The detector runs are timed by their own logs (median s / iteration).
- **Ratios**: speed-up = the peer's time / ours; above 1, ours is faster.
- **Reproduce** on a GPU machine with the CUDA toolkit and the OpenMMLab stack installed (torch
  with CUDA, mmcv 2.1 with its ops, mmengine, mmdet 3.3, e2cnn; `mmrotate-dev` 1.0 for the
  detector's comparison), from the repository root: `bash benchmarks/device_run.sh`. It builds
  the ops with CUDA for sm_90 (H100, H200: the `TORCH_CUDA_ARCH_LIST` it sets), runs the four op
  benchmarks on the idle GPU, then the test suite and the compute-sanitizer drivers
  (`benchmarks/sanitize/`), and leaves each benchmark's JSON, a summary and the logs in `$OUT`
  (default `/tmp/out`). Each step is cut so that the whole ends within `DEADLINE_S` seconds
  (default 570); give more for the whole test suite. Its three arguments choose the tests, the
  benchmarks and the sanitizer drivers, `""` for none: `bash benchmarks/device_run.sh ""
  "benchmarks/ops/bench_field_batch_norm.py benchmarks/ops/bench_re_resnet.py" ""` runs those
  two benchmarks only.
- **DAIN**, the peer of the flow projection, is timed when you have its source: set `DAIN_SRC` to
  the folder of DAIN's DepthFlowProjection kernels (`my_package/DepthFlowProjection` in DAIN's
  repository) and `benchmarks/device_run.sh` builds them beside ours; without it the flow
  benchmark times ours alone.
- **The detector against mmrotate**, and its profile: `bash benchmarks/device_run.sh "" "" ""`
  (the build alone), then `bash benchmarks/detector/detector_vs_mmrotate.sh --iters 300
  --min-iters-for-map 300`, which ends within its own `DEADLINE_S` (default 585): no run starts
  or outlives that budget, and the JSON keeps the runs that finished.
- Each benchmark's options are in its JSON (`command`). Copy a JSON into `benchmarks/results/` as
  `<name>_<device>.json`, replacing the older one, and run `python
  benchmarks/make_performance_doc.py`.
- Times of the same call differ between machines of the same kind by up to about 20%; compare
  ratios, which come from one run.

## Summary

{SUMMARY_START}
{{summary}}
{SUMMARY_END}
"""


def load(results):
    """{stem: (path, data)} for every section's file; errors on a file no section reads."""
    found, claimed = {}, set()
    for _, stem, _, _ in SECTIONS:
        paths = sorted(glob.glob(osp.join(results, f'{stem}_*.json')))
        if len(paths) > 1:
            sys.exit(f'make_performance_doc: more than one result for {stem}: {paths}; keep the '
                     f'latest only')
        if paths:
            with open(paths[0]) as f:
                found[stem] = (paths[0], json.load(f))
            claimed.add(paths[0])
    unread = sorted(set(glob.glob(osp.join(results, '*.json'))) - claimed)
    if unread:
        sys.exit(f'make_performance_doc: no section reads {unread}: add one to SECTIONS or '
                 f'delete the file')
    return found


def render(results=RESULTS):
    found = load(results)
    parts = [METHOD.format(summary=summary({k: d for k, (_, d) in found.items()}))]
    for title, stem, script, renderer in SECTIONS:
        parts.append(f'## {title}\n')
        if stem not in found:
            parts.append(f'No result yet: run `{script}`.\n')
            continue
        path, data = found[stem]
        env = data.get('environment') or {k: data.get(k) for k in ('device', 'torch', 'cuda')}
        paragraphs = renderer(path, data)
        paragraphs.append(f'Measured on {environment(env)} by `{script}`. {source(path)}')
        parts.append('\n\n'.join(paragraphs) + '\n')
    return '\n'.join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--results', default=RESULTS, help='folder of the JSON results')
    p.add_argument('--out', default=OUT, help='the page to write')
    args = p.parse_args(argv)
    text = render(args.results)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        f.write(text)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
