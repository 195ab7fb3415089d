"""Our ReDet vs mmrotate's, trained and tested on the same synthetic DOTA data.

Runs, in this order (each a training of --iters iterations at batch 2 per GPU, fp32 unless said,
from scratch, then a test on the val split, each through its project's own tools):
  mmrotate      mmrotate-dev's redet-le90_re50_refpn_1x_dota.py, its tools/train.py and test.py
  ours          configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py as shipped (on a GPU
                the whole training step and test forward captured, channels-last),
                tools/train.py and tools/test.py with no options
  ours_amp      the same with --amp
  mmrotate_ops  mmrotate's config with our RoI ops, through mmrotate's tools
                (configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py)
  ours_dist2    tools/dist_train.sh on 2 GPUs (batch 2 per GPU), skipped with fewer GPUs
  ours_eager    ours with model.cuda_graphs=False (no CUDA graph anywhere)
  ours_graph_cl ours with model.cuda_graph_step=True and, at test, cuda_graph_predict=True (the
                whole training step / test forward as one CUDA graph; cuda_graph_features off:
                the eager warm-up steps need no graphs of their own), channels-last feature
                maps (model.channels_last=True, the configs' default)
  ours_graph_amp_cl  ours_graph_cl with --amp (AmpOptimWrapper with SGD, captured)
  ours_graph, ours_graph_amp  ours_graph_cl and ours_graph_amp_cl with NCHW feature maps
                (model.channels_last=False)
The ours_graph_cl run is the captured run set against mmrotate and the eager run (`ours`); it
tests its checkpoint twice: with cuda_graph_predict, then eagerly (`test_eager_predict`), for the
mAP of the captured test forward against the eager one.
Diagnostics, only with --runs: ours_profile and ours_amp_profile train as ours and ours_amp with
mmengine's ProfilerHook on the last iterations, untimed and untested; their JSON holds the
profiler's table (ops by self CPU time, CUDA time beside).
Every run gets the same overrides (bench_configs() writes them): data, an iteration-based
schedule with the same warm-up, no validation during training, the backbone trained from random
weights with no frozen stage, logging every --log-interval iterations averaged over that window,
and an endless sampler (no epoch ends: mmengine's iteration loop sleeps 2 s at each one, long
against a logged window of a short run).
Measured: s/iteration = median of the logged windows after --skip warm-up iterations; test s/image
likewise from the test log (batch 1), and without mmengine's data_time (the model's s/image);
peak memory = the largest `memory` mmengine logs
(torch.cuda.max_memory_allocated, MB), and the allocated and reserved peaks of the whole process
(RedetPeakMemoryHook: redet_plugin/engine/peak_memory_hook.py, added to every run; the memory
goal is judged on reserved memory where both runs have it, since a CUDA graph's pool is reserved,
not allocated); mAP@0.5 (DOTA metric, 11 points, classes with objects).
mmrotate reads DOTA annotation files without the `imagesource:`/`gsd:` header lines, so it gets a
copy of the labels without them (<split>/annfiles/). The JSON is rewritten after every run, and
with --budget-s no run starts (and no process outlives) the budget, so a cut call keeps what ran.

    python -m benchmarks.detector.bench_detector_vs_mmrotate --out results.json [--iters 100]
        [--runs ...]
(repo root; benchmarks/detector/detector_vs_mmrotate.sh runs it on the GPU machine.)
"""
import argparse
import functools
import glob
import importlib.util
import json
import os
import os.path as osp
import re
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.detector.summarize_training import summarize
from redet_plugin.engine.peak_memory_hook import read_peaks

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RUNS = ('mmrotate', 'ours', 'ours_amp', 'mmrotate_ops', 'ours_dist2', 'ours_eager',
        'ours_graph_cl', 'ours_graph_amp_cl', 'ours_graph', 'ours_graph_amp')
CAPTURED = 'ours_graph_cl'  # the whole step captured in the configs' layout
# diagnostics, run only when named: where a training iteration's host time goes
PROFILE_RUNS = ('ours_profile', 'ours_amp_profile')
PROFILED_ITERS = 3  # the last iterations of a profile run, under torch.profiler
MIN_RUN_S = 60  # a run is not started with less of the budget left
OPS_CONFIG = osp.join(REPO, 'configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py')
# --dataset: mmrotate's config, ours, and how each names the generated splits (DOTA: folders;
# HRSC2016: image-set lists under FullDataSet/, the same constructor arguments in both projects)
DATASETS = dict(
    dota=dict(mmrotate='mmrotate::redet/redet-le90_re50_refpn_1x_dota.py',
              ours=osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py'),
              runs=RUNS + PROFILE_RUNS),
    hrsc=dict(mmrotate='mmrotate::redet/redet-le90_re50_refpn_3x_hrsc.py',
              ours=osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_3x_hrsc.py'),
              runs=('mmrotate', 'ours', 'ours_amp', 'ours_eager', CAPTURED)),
)
MAP50_KEYS = ('dota/mAP', 'hrsc_voc07/AP50')  # mmrotate's DOTAMetric; ours on HRSC2016 (11 points)
PEER_ANN_DIR = 'annfiles'  # labels without header lines, for mmrotate
MEMORY_HOOK_IMPORT = 'redet_plugin.mm'  # registers RedetPeakMemoryHook (with the whole mm layer)
MEMORY_HOOK = dict(type='mmdet.RedetPeakMemoryHook')
# the configs as shipped: speed-ups over mmrotate (training in fp32 and with --amp, test end to
# end), amp's speed-up and mAP cost, scaling on 2 GPUs; the explicitly captured runs' speed-ups
# over mmrotate (test: end to end, and the model's time without the wait for data) and over
# their own fp32 step
GOALS = dict(train_speedup=7.0, train_amp_speedup=10.0, test_speedup=10.0, amp_speedup=1.4,
             amp_map_drop=0.01,
             dist2_scaling=1.85, captured_train_speedup=5.0, captured_test_speedup=4.0,
             captured_test_model_speedup=5.0, captured_amp_speedup=1.5, captured_map_gap=0.01,
             captured_test_map_gap=0.002)


DEFAULT_DATA_ROOT = osp.join(REPO, 'data', 'synthetic_dota_1024')


def add_run_and_data_args(p, work_root):
    """The arguments every detector benchmark takes: where results, logs and runs go, and the
    synthetic data (made when missing)."""
    p.add_argument('--out', required=True, help='JSON file for the results')
    p.add_argument('--log-dir', help='logs and derived configs (default: next to --out)')
    p.add_argument('--work-root', default=osp.join(REPO, 'work_dirs', work_root))
    p.add_argument('--data-root', default=DEFAULT_DATA_ROOT)
    p.add_argument('--num-train', type=int, default=100, help='images made when data is missing')
    p.add_argument('--num-val', type=int, default=50, help='test images made when data is missing')
    p.add_argument('--image-size', type=int, default=1024, help='of the images made')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_and_data_args(p, 'detector_vs_mmrotate')
    p.add_argument('--resize', type=int, help='Resize scale in every pipeline (default: the '
                   "configs' 1024; smaller only for a quick check on the CPU)")
    p.add_argument('--iters', type=int, default=100, help='training iterations per run')
    p.add_argument('--log-interval', type=int, default=10)
    p.add_argument('--skip', type=int, default=20, help='warm-up iterations left out of s/iter')
    p.add_argument('--lr-warmup', type=int, default=50, help='linear lr warm-up iterations')
    p.add_argument('--workers', type=int, default=8,
                   help="data loader workers per process (the configs' count)")
    p.add_argument('--runs', nargs='+', default=list(RUNS), choices=RUNS + PROFILE_RUNS)
    p.add_argument('--dataset', choices=sorted(DATASETS), default='dota',
                   help="whose configs and which generated layout: DOTA (mmrotate's 1x DOTA "
                        "config) or HRSC2016 (both projects' 3x HRSC configs)")
    p.add_argument('--ours-config', help="default: the --dataset's config of ours")
    p.add_argument('--val-interval', type=int,
                   help='our runs also test on the test split every this many iterations during '
                        'training (the mAP curve; default: no validation)')
    p.add_argument('--min-iters-for-map', type=int, default=400,
                   help='below this, mAP goals are reported as null (too little training)')
    p.add_argument('--timeout', type=int, default=900, help='seconds per training or test process')
    p.add_argument('--budget-s', type=int, help='seconds for the whole benchmark (default: none)')
    args = p.parse_args(argv)
    for name in ('iters', 'log_interval', 'workers', 'num_train', 'num_val', 'image_size',
                 'val_interval'):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name == 'workers' else 1):
            p.error(f'--{name.replace("_", "-")}: got {getattr(args, name)}')
    if args.skip >= args.iters:
        p.error(f'--skip ({args.skip}) must be below --iters ({args.iters})')
    args.log_dir = args.log_dir or osp.splitext(args.out)[0]
    dataset = DATASETS[args.dataset]
    args.ours_config = args.ours_config or dataset['ours']
    if args.dataset != 'dota' and args.data_root == DEFAULT_DATA_ROOT:
        args.data_root = osp.join(REPO, 'data', f'synthetic_{args.dataset}')
    unsupported = [run for run in args.runs if run not in dataset['runs']]
    if unsupported:
        p.error(f'--runs {unsupported}: not with --dataset {args.dataset} '
                f'(its runs: {list(dataset["runs"])})')
    return args


# ---- data ---------------------------------------------------------------------------------------
def ensure_data(args, log_dir):
    dataset = args.dataset
    made = (osp.join(args.data_root, 'train', 'labelTxt') if dataset == 'dota' else
            osp.join(args.data_root, 'ImageSets', 'test.txt'))
    if not osp.exists(made):
        run_logged([sys.executable, osp.join(REPO, 'tools/dataset_converters/make_synthetic_dota.py'),
                    args.data_root, '--layout', dataset, '--image-size', str(args.image_size),
                    '--num-train', str(args.num_train), '--num-val', str(args.num_val)],
                   osp.join(log_dir, 'make_data.log'), args.timeout, subprocess_env(), check=True)
    if dataset != 'dota':
        return {split: len(open(osp.join(args.data_root, 'ImageSets', f'{split}.txt')).read().split())
                for split in ('trainval', 'test')}
    for split in ('train', 'val'):
        write_peer_labels(osp.join(args.data_root, split))
    return {split: len(glob.glob(osp.join(args.data_root, split, 'labelTxt', '*.txt')))
            for split in ('train', 'val')}


def write_peer_labels(split_dir, out_dir=None, stems=None):
    """out_dir (default <split>/annfiles/): the labelTxt files (of the images named by `stems`,
    default all) without the imagesource:/gsd: header lines."""
    out_dir = out_dir or osp.join(split_dir, PEER_ANN_DIR)
    os.makedirs(out_dir, exist_ok=True)
    for path in glob.glob(osp.join(split_dir, 'labelTxt', '*.txt')):
        if stems is not None and osp.splitext(osp.basename(path))[0] not in stems:
            continue
        with open(path) as f:
            lines = [line for line in f if not line.startswith(('imagesource:', 'gsd:'))]
        with open(osp.join(out_dir, osp.basename(path)), 'w') as f:
            f.writelines(lines)


# ---- configs ------------------------------------------------------------------------------------
def bench_configs(args, config_dir):
    """One derived config per project; every run of that project uses it."""
    peer = dict(base=DATASETS[args.dataset]['mmrotate'], ann=PEER_ANN_DIR,
                scratch='backbone=dict(init_cfg=None, frozen_stages=-1)')
    configs = {
        'mmrotate': dict(peer),
        'mmrotate_ops': dict(peer, base=OPS_CONFIG),
        'ours': dict(base=osp.abspath(args.ours_config), ann='labelTxt',
                     scratch='backbone=dict(init_cfg=None, frozen_stages=-1)',
                     val_interval=args.val_interval),
    }
    if args.dataset != 'dota':
        del configs['mmrotate_ops']
    os.makedirs(config_dir, exist_ok=True)
    paths = {}
    for name, spec in configs.items():
        path = osp.join(config_dir, f'{name}.py')
        with open(path, 'w') as f:
            f.write(config_text(args, spec) + memory_hook_text(spec['base']))
        if args.resize:
            with open(path, 'a') as f:
                f.write(resized_pipelines(path, args.resize))
        check_memory_hook(path, spec['base'])
        paths[name] = path
    paths['ours_profile'] = osp.join(config_dir, 'ours_profile.py')
    wait = max(args.iters - PROFILED_ITERS - 2, 0)
    with open(paths['ours_profile'], 'w') as f:
        f.write(f"""_base_ = {paths['ours']!r}
custom_hooks = [dict(type='ProfilerHook', by_epoch=False, profile_times={args.iters},
                     activity_with_cpu=True, activity_with_cuda=True,
                     schedule=dict(wait={wait}, warmup=2, active={PROFILED_ITERS}),
                     on_trace_ready=dict(type='log_trace', sort_by='self_cpu_time_total',
                                         row_limit=50))]
""")
    return paths


def imports_and_hooks(config):
    """([custom imports], [custom hooks]) of a config, or None when it cannot be read."""
    from mmengine.config import Config
    try:
        cfg = Config.fromfile(config, import_custom_modules=False)
    except Exception:  # e.g. mmrotate missing: its runs are skipped anyway
        return None
    return (list((cfg.get('custom_imports') or {}).get('imports', [])),
            [dict(hook) for hook in cfg.get('custom_hooks') or []])


def memory_hook_text(base):
    """Config lines adding RedetPeakMemoryHook to a run, keeping the base config's custom imports
    and hooks (a derived config's lists replace the base's). The hook is named with its scope, so
    that mmrotate's configs (default scope mmrotate) find it too."""
    imports, hooks = imports_and_hooks(base) or ([], [])
    if MEMORY_HOOK_IMPORT not in imports:
        imports.append(MEMORY_HOOK_IMPORT)
    hooks.append(MEMORY_HOOK)
    return (f"custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n"
            f"custom_hooks = {hooks!r}\n")


def check_memory_hook(path, base):
    """Raises unless the derived config at `path` keeps its base's imports and hooks and adds the
    memory hook (skipped where the base cannot be read)."""
    if imports_and_hooks(base) is None:
        return
    imports, hooks = imports_and_hooks(base)
    derived_imports, derived_hooks = imports_and_hooks(path)
    missing = [name for name in dict.fromkeys(imports + [MEMORY_HOOK_IMPORT])
               if name not in derived_imports]
    if missing or derived_hooks != hooks + [MEMORY_HOOK]:
        raise RuntimeError(f'{path}: custom_imports {derived_imports} (missing {missing}), '
                           f'custom_hooks {derived_hooks}: expected the base\'s and '
                           f'{MEMORY_HOOK}')


def roi_layers(config_path):
    """The RoI layer type of each RoI stage of a config, for the record (stage 1 differs: ours
    is RoIPool in the synthetic config, mmrotate's RoIAlign)."""
    from mmengine.config import Config
    try:
        cfg = Config.fromfile(config_path, import_custom_modules=False)
    except Exception as error:  # e.g. mmrotate missing: its runs are skipped anyway
        return f'unreadable: {error}'
    return [f"{e['type']}/{e['roi_layer']['type']}"
            for e in cfg.model.roi_head.bbox_roi_extractor]


def config_text(args, spec):
    root = osp.abspath(args.data_root) + '/'
    loader = f'num_workers={args.workers}, persistent_workers={args.workers > 0}'
    if args.dataset == 'dota':
        datasets = {key: dict(data_root=root, ann_file=f"{split}/{spec['ann']}/",
                              data_prefix=dict(img_path=f'{split}/images/'))
                    for key, split in (('train_dataloader', 'train'), ('test_dataloader', 'val'))}
    else:
        datasets = {key: dict(data_root=root, ann_file=f'ImageSets/{split}.txt',
                              data_prefix=dict(sub_data_root='FullDataSet/'))
                    for key, split in (('train_dataloader', 'trainval'),
                                       ('test_dataloader', 'test'))}
    test_loader = f"dict(batch_size=1, {loader}, dataset={datasets['test_dataloader']!r})"
    val_interval = f", val_interval={spec['val_interval']}" if spec.get('val_interval') else ''
    return f"""# Written by benchmarks/detector/bench_detector_vs_mmrotate.py: the shared benchmark
# settings.
_base_ = {spec['base']!r}
model = dict({spec['scratch']})
load_from = None
randomness = dict(seed=0)
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={args.iters}{val_interval})
{validation_text(spec.get('val_interval'), test_loader)}
param_scheduler = [dict(type='LinearLR', start_factor=1.0 / 3, by_epoch=False, begin=0,
                        end={args.lr_warmup})]
# (metrics logged at the iteration, not the epoch, of an iteration-based run)
default_hooks = dict(logger=dict(interval={args.log_interval}, log_metric_by_epoch=False),
                     checkpoint=dict(by_epoch=False, interval={args.iters}, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size={args.log_interval})
train_dataloader = dict(batch_size=2, {loader},
                        sampler=dict(_delete_=True, type='InfiniteSampler', shuffle=True),
                        dataset={datasets['train_dataloader']!r})
test_dataloader = {test_loader}
"""


def validation_text(interval, test_loader):
    """The config's validation: none, or a test with `test_loader` (every `interval` training
    iterations, as train_cfg says: the mAP curve of a run, from its training log)."""
    if not interval:
        return 'val_cfg = None\nval_dataloader = None\nval_evaluator = None'
    return (f"val_cfg = dict(type='ValLoop')\nval_dataloader = {test_loader}\n"
            f"val_evaluator = _base_.test_evaluator")


def resized_pipelines(config_path, size):
    """Config lines that set the config's train, validation and test pipelines with every Resize at
    size^2."""
    from mmengine.config import Config
    cfg = Config.fromfile(config_path, import_custom_modules=False)
    lines = ''
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if not cfg.get(key):  # (no validation)
            continue
        pipeline = [step.to_dict() for step in cfg[key]['dataset']['pipeline']]
        for step in pipeline:
            if str(step.get('type', '')).split('.')[-1] == 'Resize':
                step['scale'] = (size, size)
        lines += f"{key}['dataset']['pipeline'] = {pipeline!r}\n"
    return lines


# ---- processes ----------------------------------------------------------------------------------
def run_logged(cmd, log_path, timeout, env=None, check=False):
    """Runs cmd with output to log_path; returns (rc, seconds)."""
    start = time.time()
    with open(log_path, 'w') as log:
        log.write('$ ' + ' '.join(cmd) + '\n')
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    seconds = round(time.time() - start, 1)
    if check and rc != 0:
        sys.exit(f'error: {cmd[1]} failed (rc={rc}); see {log_path}')
    return rc, seconds


def tail(path, lines=15):
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-lines:])


def mmrotate_tools():
    """mmrotate's tools/ folder in the installed package, or None without mmrotate."""
    spec = importlib.util.find_spec('mmrotate')  # (locates the package without importing it)
    if spec is None or not spec.submodule_search_locations:
        return None
    return osp.join(list(spec.submodule_search_locations)[0], '.mim', 'tools')


def commands(run, config, work_dir, test_dir, iters):
    """(train command, test command, extra environment of the test) of one run."""
    checkpoint = osp.join(work_dir, f'iter_{iters}.pth')
    if run.startswith('mmrotate'):
        tools = mmrotate_tools()
        # its checkpoints hold mmengine objects that torch's weights-only loader refuses
        return ([sys.executable, osp.join(tools, 'train.py'), config, '--work-dir', work_dir],
                [sys.executable, osp.join(tools, 'test.py'), config, checkpoint, '--work-dir',
                 test_dir], dict(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='1'))
    if run == 'ours_dist2':
        train = ['bash', osp.join(REPO, 'tools/dist_train.sh'), config, '2']
    else:
        train = [sys.executable, osp.join(REPO, 'tools/train.py'), config]
    train += ['--work-dir', work_dir] + (['--amp'] if 'amp' in run.split('_') else [])
    test = [sys.executable, osp.join(REPO, 'tools/test.py'), config, checkpoint, '--work-dir',
            test_dir]
    train_options, test_options = [], []
    if run == 'ours_eager':
        train_options = test_options = ['model.cuda_graphs=False']
    if run.startswith('ours_graph'):
        train_options = ['model.cuda_graph_step=True', 'model.cuda_graph_features=False']
        test_options = ['model.cuda_graph_predict=True', 'model.cuda_graph_features=False']
        layout = f"model.channels_last={'cl' in run.split('_')}"
        train_options, test_options = train_options + [layout], test_options + [layout]
    train += (['--cfg-options'] + train_options) if train_options else []
    test += (['--cfg-options'] + test_options) if test_options else []
    return train, test, {}


def eager_predict_command(test_cmd, test_dir, eager_dir):
    """An ours_graph run's test command with the test forward eager, its logs in eager_dir."""
    return [eager_dir if arg == test_dir else
            arg.replace('model.cuda_graph_predict=True', 'model.cuda_graph_predict=False')
            for arg in test_cmd]


def subprocess_env(extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, env.get('PYTHONPATH')) if p)
    env.update(extra or {})
    return env


# ---- logs ---------------------------------------------------------------------------------------
_TEST_ITER = re.compile(r'(?:Epoch|Iter)\(test\)\s*\[\s*(\d+)/(\d+)\]\s+eta:.*?\btime: ([0-9.]+)'
                        r'(?:\s+data_time: ([0-9.]+))?(?:.*?memory: (\d+))?')


def map50(metrics):
    """mAP@0.5 from a run's metrics, by either project's name for it (None when absent)."""
    return next((metrics[key] for key in MAP50_KEYS if key in metrics), None)


def test_summary(test_dir, skip=1):
    """s/image (median of the logged windows after the first `skip`), the same without the wait
    for data (mmengine's data_time: the model's time per image), peak memory and the metrics."""
    logs = sorted(glob.glob(osp.join(test_dir, '*', '*.log')))
    windows, model_windows, memory = [], [], []
    for line in open(logs[-1]) if logs else []:
        match = _TEST_ITER.search(line)
        if match:
            windows.append(float(match.group(3)))
            if match.group(4):
                model_windows.append(float(match.group(3)) - float(match.group(4)))
            if match.group(5):
                memory.append(int(match.group(5)))
    metrics = {}
    for path in sorted(glob.glob(osp.join(test_dir, '*', '*.json'))):
        with open(path) as f:
            metrics = {k: v for k, v in json.load(f).items() if '/' in k}
    steady, model_steady = windows[skip:] or windows, model_windows[skip:] or model_windows
    return dict(s_per_image=statistics.median(steady) if steady else None,
                model_s_per_image=statistics.median(model_steady) if model_steady else None,
                logged_windows=windows, peak_memory_mb=max(memory) if memory else None,
                peak_cuda_memory=read_peaks(test_dir),
                mAP50=map50(metrics),
                metrics=metrics)


def profiler_table(log_path):
    """The lines of the last table torch.profiler printed into a training log."""
    lines = open(log_path, errors='replace').read().splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith('Self CPU time total')]
    if not ends:
        return None
    end = ends[-1]
    header = max(i for i in range(end) if 'Self CPU %' in lines[i])
    return lines[header - 1:end + 2]  # (from the rule above the header; CUDA total after CPU)


def train_summary(work_dir, images_per_iter, skip):
    result = summarize(work_dir, images_per_iter, skip)
    val = result.pop('val', None) or []
    curve = [(r['step'], map50(r)) for r in val]
    if curve:
        result['map50_curve'] = curve  # (iteration, mAP@0.5) of each validation
    result['peak_cuda_memory'] = read_peaks(work_dir)
    return result


# ---- one run ------------------------------------------------------------------------------------
def time_left(args, deadline):
    """A process's time limit: --timeout, cut to what is left of the budget."""
    return args.timeout if deadline is None else max(1, min(args.timeout,
                                                            int(deadline - time.time())))


def bench_run(run, args, config, gpus, deadline, save):
    """One run's results; `save(partial)` keeps them after the training and before each test (a
    call cut during a test keeps what finished before it)."""
    if run == 'ours_dist2' and gpus < 2:
        return dict(skipped=f'{gpus} GPU(s): dist_train.sh on 2 GPUs needs 2')
    if run.startswith('mmrotate') and mmrotate_tools() is None:
        return dict(skipped='mmrotate is not installed (mmrotate-dev 1.0.1 is the peer)')
    work_dir = osp.join(args.work_root, run)
    test_dir = work_dir + '_test'
    for folder in (work_dir, test_dir):  # (an earlier run's logs would mix into this one's)
        shutil.rmtree(folder, ignore_errors=True)
    train_cmd, test_cmd, test_env = commands(run, config, work_dir, test_dir, args.iters)
    result = dict(config=config, train_command=' '.join(train_cmd))
    train_log = osp.join(args.log_dir, f'train_{run}.log')
    rc, result['train_wall_s'] = run_logged(train_cmd, train_log, time_left(args, deadline),
                                            subprocess_env())
    if rc != 0:
        return dict(result, error=f'training rc={rc}', log_tail=tail(train_log))
    if run in PROFILE_RUNS:
        return dict(result, profile_table=profiler_table(train_log))
    images_per_iter = 2 * (2 if run == 'ours_dist2' else 1)
    result['train'] = train_summary(work_dir, images_per_iter, args.skip)
    save(result)  # a test cut by the budget leaves the training's numbers
    test_log = osp.join(args.log_dir, f'test_{run}.log')
    rc, result['test_wall_s'] = run_logged(test_cmd, test_log, time_left(args, deadline),
                                           subprocess_env(test_env))
    if rc != 0:
        return dict(result, error=f'test rc={rc}', log_tail=tail(test_log))
    result['test'] = test_summary(test_dir)
    print(f"{run}: {result['train']['median_iter_time_s']:.4f} s/iter, "
          f"{result['test']['s_per_image']} s/image, mAP {result['test']['mAP50']}", flush=True)
    if run == CAPTURED:  # the same checkpoint, tested eagerly (one run answers that goal)
        save(result)
        eager_dir = test_dir + '_eager'
        eager_cmd = eager_predict_command(test_cmd, test_dir, eager_dir)
        shutil.rmtree(eager_dir, ignore_errors=True)
        rc, _ = run_logged(eager_cmd, osp.join(args.log_dir, f'test_{run}_eager.log'),
                           time_left(args, deadline), subprocess_env(test_env))
        result['test_eager_predict'] = (test_summary(eager_dir) if rc == 0
                                        else dict(error=f'test rc={rc}'))
    return result


# ---- comparison ---------------------------------------------------------------------------------
def comparison(runs, args):
    """Ratios against mmrotate (speed-ups: > 1 = faster; memory: < 1 = less) and the goals
    (null where a run is missing or, for mAP, trained too briefly)."""
    def get(run, *keys):
        value = runs.get(run)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    def at_least(value, bound):
        return None if value is None else bool(value >= bound)

    (step, image, model_image, memory, test_memory, rate, map50, reserved, test_reserved,
     eager_map50) = (
        lambda run, k=k: get(run, *k) for k in (
            ('train', 'median_iter_time_s'), ('test', 's_per_image'),
            ('test', 'model_s_per_image'), ('train', 'peak_memory_mb'),
            ('test', 'peak_memory_mb'), ('train', 'images_per_s'), ('test', 'mAP50'),
            ('train', 'peak_cuda_memory', 'reserved_mb'),
            ('test', 'peak_cuda_memory', 'reserved_mb'), ('test_eager_predict', 'mAP50')))
    ratios = dict(
        train_speedup_ours=ratio(step('mmrotate'), step('ours')),
        train_speedup_mmrotate_ops=ratio(step('mmrotate'), step('mmrotate_ops')),
        test_speedup_ours=ratio(image('mmrotate'), image('ours')),
        test_speedup_mmrotate_ops=ratio(image('mmrotate'), image('mmrotate_ops')),
        train_memory_ours_over_mmrotate=ratio(memory('ours'), memory('mmrotate')),
        train_memory_mmrotate_ops_over_mmrotate=ratio(memory('mmrotate_ops'), memory('mmrotate')),
        test_memory_ours_over_mmrotate=ratio(test_memory('ours'), test_memory('mmrotate')),
        amp_speedup=ratio(step('ours'), step('ours_amp')),
        train_speedup_ours_amp=ratio(step('mmrotate'), step('ours_amp')),
        dist2_scaling=ratio(rate('ours_dist2'), rate('ours')),
        train_speedup_eager=ratio(step('mmrotate'), step('ours_eager')),
        test_speedup_eager=ratio(image('mmrotate'), image('ours_eager')),
        train_memory_eager_over_mmrotate=ratio(memory('ours_eager'), memory('mmrotate')),
        train_reserved_ours_over_mmrotate=ratio(reserved('ours'), reserved('mmrotate')),
        train_reserved_eager_over_mmrotate=ratio(reserved('ours_eager'), reserved('mmrotate')),
        test_reserved_ours_over_mmrotate=ratio(test_reserved('ours'), test_reserved('mmrotate')),
        train_speedup_graph=ratio(step('mmrotate'), step(CAPTURED)),
        test_speedup_graph=ratio(image('mmrotate'), image(CAPTURED)),
        test_model_speedup_graph=ratio(model_image('mmrotate'), model_image(CAPTURED)),
        train_graph_over_ours=ratio(step('ours'), step(CAPTURED)),
        train_reserved_graph_over_mmrotate=ratio(reserved(CAPTURED), reserved('mmrotate')),
        amp_speedup_graph=ratio(step('ours_graph'), step('ours_graph_amp')),
        channels_last_speedup_graph=ratio(step('ours_graph'), step('ours_graph_cl')),
        channels_last_speedup_graph_amp=ratio(step('ours_graph_amp'), step('ours_graph_amp_cl')),
        amp_speedup_graph_cl=ratio(step('ours_graph_cl'), step('ours_graph_amp_cl')),
        amp_cl_over_fp32_graph=ratio(step('ours_graph'), step('ours_graph_amp_cl')),
    )
    map_ok = args.iters >= args.min_iters_for_map
    has_maps = map_ok and None not in (map50('ours'), map50('ours_amp'))
    beats_peer = map_ok and None not in (map50('ours'), map50('mmrotate'))
    # reserved memory where both runs recorded it: a CUDA graph's pool is reserved, not allocated
    memory_ratio = (ratios['train_reserved_ours_over_mmrotate']
                    or ratios['train_memory_ours_over_mmrotate'])
    goals = dict(
        train_fp32_at_least_7x_mmrotate=at_least(ratios['train_speedup_ours'],
                                                 GOALS['train_speedup']),
        train_amp_at_least_10x_mmrotate=at_least(ratios['train_speedup_ours_amp'],
                                                 GOALS['train_amp_speedup']),
        test_at_least_10x_mmrotate_per_image=at_least(ratios['test_speedup_ours'],
                                                      GOALS['test_speedup']),
        train_peak_memory_not_above_mmrotate=None if memory_ratio is None else memory_ratio <= 1,
        amp_at_least_1_4x_fp32=at_least(ratios['amp_speedup'], GOALS['amp_speedup']),
        amp_map_within_1_point=(bool(map50('ours') - map50('ours_amp') <= GOALS['amp_map_drop'])
                                if has_maps else None),
        dist2_at_least_1_85x_one_gpu=at_least(ratios['dist2_scaling'], GOALS['dist2_scaling']),
        map_not_below_mmrotate=bool(map50('ours') >= map50('mmrotate')) if beats_peer else None,
        train_captured_at_least_5x_mmrotate=at_least(ratios['train_speedup_graph'],
                                                     GOALS['captured_train_speedup']),
        test_captured_at_least_4x_mmrotate_per_image=at_least(ratios['test_speedup_graph'],
                                                              GOALS['captured_test_speedup']),
        test_captured_model_at_least_5x_mmrotate_per_image=at_least(
            ratios['test_model_speedup_graph'], GOALS['captured_test_model_speedup']),
        train_captured_peak_memory_not_above_mmrotate=(
            None if ratios['train_reserved_graph_over_mmrotate'] is None
            else ratios['train_reserved_graph_over_mmrotate'] <= 1),
        # --amp against fp32, both captured, in one layout (channels-last where both ran)
        amp_captured_at_least_1_5x_fp32=at_least(
            ratios['amp_speedup_graph_cl'] or ratios['amp_speedup_graph'],
            GOALS['captured_amp_speedup']),
        # a captured training (and test) run against the config's eager one, each trained from
        # scratch on the same data
        captured_map_within_1_point_of_eager=(
            bool(abs(map50('ours') - map50(CAPTURED)) <= GOALS['captured_map_gap'])
            if map_ok and None not in (map50('ours'), map50(CAPTURED)) else None),
        # the captured test forward against the eager one, on the same checkpoint
        captured_test_map_within_0_002_of_eager=(
            bool(abs(map50(CAPTURED) - eager_map50(CAPTURED)) <= GOALS['captured_test_map_gap'])
            if None not in (map50(CAPTURED), eager_map50(CAPTURED)) else None),
    )
    notes = [] if map_ok else [f'mAP goals null: {args.iters} iterations < '
                               f'--min-iters-for-map {args.min_iters_for_map}']
    if memory_ratio is not None:
        notes.append('train_peak_memory goal judged on ' + (
            'reserved memory (RedetPeakMemoryHook)' if ratios['train_reserved_ours_over_mmrotate']
            else "allocated memory (mmengine's log; no reserved peak recorded)"))
    return dict(ratios=ratios, goals=goals, notes=notes)


def environment(gpus):
    """Versions and the GPU's name; the name from nvidia-smi, so that this process holds no CUDA
    context (memory) while the runs train."""
    import torch
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for package in ('mmcv', 'mmengine', 'mmdet', 'mmrotate-dev', 'e2cnn'):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    device = 'cpu'
    if gpus:
        try:
            device = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                                    capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            device = 'cuda (name unknown)'
    return dict(torch=torch.__version__, cuda=torch.version.cuda, gpus=gpus, device=device,
                packages=found)


def main(argv=None):
    args = parse_args(argv)
    import torch
    start = time.time()
    deadline = start + args.budget_s if args.budget_s else None
    gpus = torch.cuda.device_count()
    os.makedirs(args.log_dir, exist_ok=True)
    images = ensure_data(args, args.log_dir)
    configs = bench_configs(args, osp.join(args.log_dir, 'configs'))
    result = dict(
        what=f'ReDet R50 (ReResNet-50 + ReFPN) on synthetic {args.dataset.upper()}-layout images: '
             'mmrotate-dev 1.0.1 as shipped, mmrotate with our RoI ops (DOTA), ours; same data, '
             'schedule and batch, from scratch (benchmarks/detector/bench_detector_vs_mmrotate.py)',
        command=' '.join(['python -m benchmarks.detector.bench_detector_vs_mmrotate']
                         + (argv if argv is not None else sys.argv[1:])),
        environment=environment(gpus),
        settings=dict(iters=args.iters, batch_per_gpu=2, log_interval=args.log_interval,
                      skip=args.skip, lr_warmup=args.lr_warmup, workers=args.workers,
                      resize=args.resize or "the configs' own", dataset=args.dataset,
                      data_root=args.data_root, images=images,
                      roi_layers={name: roi_layers(path) for name, path in configs.items()}),
        runs={})
    def save(run, outcome):  # after every run: a cut call keeps the finished runs
        result['runs'][run] = outcome
        result.update(comparison(result['runs'], args), wall_s=round(time.time() - start))
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)

    for run in args.runs:
        left = None if deadline is None else deadline - time.time()
        if left is not None and left < MIN_RUN_S:
            outcome = dict(skipped=f'budget: {left:.0f} s left of --budget-s')
        else:
            config = configs[run if run.startswith('mmrotate') else
                             'ours_profile' if run in PROFILE_RUNS else 'ours']
            outcome = bench_run(run, args, config, gpus, deadline,
                                functools.partial(save, run))
        if 'error' in outcome:
            print(f"{run}: {outcome['error']}\n{outcome['log_tail']}", flush=True)
        elif 'skipped' in outcome:
            print(f"{run}: skipped ({outcome['skipped']})", flush=True)
        save(run, outcome)
    print(json.dumps(dict(ratios=result['ratios'], goals=result['goals'],
                          notes=result['notes']), indent=1))


if __name__ == '__main__':
    main()
