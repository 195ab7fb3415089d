"""ReDet R50 at 1024 x 1024 on one GPU and on two (tools/dist_train.sh), side by side.

Every run trains the synthetic-1024 config from scratch with the project's fastest setting
(the whole training step as one CUDA graph, on 2 GPUs with its gradient all-reduce inside it:
RedetDistributedDataParallel; --amp; --eager-step keeps the eager step with the backbone + neck
as CUDA graphs) and --auto-scale-lr, then tests through the tools:
  speed_1gpu  1 GPU, batch 2: the images/s two GPUs are measured against (--speed-epochs epochs)
  dist2       2 GPUs x batch 2 (tools/dist_train.sh), --epochs epochs; tested on 1 GPU
  dist2_test  tools/dist_test.sh on 2 GPUs with dist2's checkpoint: its detections against the
              1-GPU test's, image by image
  map_1gpu    1 GPU, batch 4 (dist2's total batch, hence its learning rate and iterations),
              --epochs epochs: the mAP two GPUs should reach
Measured: images/s = images per iteration / median s/iteration of the logged windows after
--skip warm-up iterations (rank 0's log: the step including DDP's gradient all-reduce); mAP@0.5
(DOTA metric, 11 points) on the val split; the detections of dist2_test vs dist2's 1-GPU test.
The JSON is rewritten after every run; with --budget-s no run starts (and no process outlives)
the budget, so a cut call keeps what ran. Runs needing 2 GPUs are skipped with fewer.

    python -m benchmarks.detector.bench_multi_gpu --out multi_gpu.json [--epochs 8]
(repo root). --cpu checks the script on a machine without a GPU: 2 processes over gloo, no AMP,
tiny data (give --resize, --num-train, ...); its numbers mean nothing.
"""
import argparse
import json
import os
import os.path as osp
import pickle
import shutil
import socket
import sys
import time

# shared with the mmrotate comparison: processes, logs, summaries, environment
from benchmarks.detector.bench_detector_vs_mmrotate import (
    add_run_and_data_args, environment, memory_hook_text, resized_pipelines, run_logged, tail,
    test_summary, train_summary)

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_2e_synthetic-1024.py')
RUNS = ('speed_1gpu', 'dist2', 'dist2_test', 'map_1gpu')
MIN_RUN_S = 45  # a run is not started with less of the budget left
BATCH_PER_GPU = 2
# the goals the scaling run is judged by (docs/multi_gpu.md)
GOALS = dict(scaling=1.9, map_difference=0.01)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_and_data_args(p, 'multi_gpu')
    p.add_argument('--resize', type=int, help="Resize scale of the pipelines (default: the "
                   "config's 1024)")
    p.add_argument('--epochs', type=int, default=8, help='epochs of dist2 and map_1gpu')
    p.add_argument('--speed-epochs', type=int, default=2, help='epochs of speed_1gpu')
    p.add_argument('--log-interval', type=int, default=10)
    p.add_argument('--skip', type=int, default=20, help='warm-up iterations left out of s/iter')
    p.add_argument('--workers', type=int, default=4, help='data loader workers per process')
    p.add_argument('--runs', nargs='+', default=list(RUNS), choices=RUNS)
    p.add_argument('--timeout', type=int, default=900, help='seconds per training or test process')
    p.add_argument('--budget-s', type=int, help='seconds for the whole benchmark (default: none)')
    p.add_argument('--eager-step', action='store_true',
                   help='train with the eager step (model.cuda_graph_step=False)')
    p.add_argument('--cpu', action='store_true', help='check the script without a GPU')
    args = p.parse_args(argv)
    for name in ('epochs', 'speed_epochs', 'log_interval', 'num_train', 'num_val', 'image_size'):
        if getattr(args, name) < 1:
            p.error(f'--{name.replace("_", "-")}: expected at least 1, got {getattr(args, name)}')
    if args.workers < 0:
        p.error(f'--workers: expected at least 0, got {args.workers}')
    args.log_dir = args.log_dir or osp.splitext(args.out)[0]
    return args


# ---- data and config ----------------------------------------------------------------------------
def ensure_data(args, env):
    if not osp.isdir(osp.join(args.data_root, 'train', 'labelTxt')):
        make_data = osp.join(REPO, 'tools/dataset_converters/make_synthetic_dota.py')
        rc, _ = run_logged([sys.executable, make_data, args.data_root, '--image-size',
                            str(args.image_size), '--num-train', str(args.num_train),
                            '--num-val', str(args.num_val)],
                           osp.join(args.log_dir, 'make_data.log'), args.timeout, env)
        if rc != 0:
            sys.exit(f'error: making the data failed; see {args.log_dir}/make_data.log')
    return {split: len(os.listdir(osp.join(args.data_root, split, 'labelTxt')))
            for split in ('train', 'val')}


def write_config(args, path):
    """The config every run uses: the data, --epochs, no validation while training, one
    checkpoint at the end, logging every --log-interval iterations averaged over that window."""
    root = osp.abspath(args.data_root) + '/'
    loader = f'num_workers={args.workers}, persistent_workers={args.workers > 0}'
    text = f"""# Written by benchmarks/detector/bench_multi_gpu.py: the settings every run shares.
_base_ = {CONFIG!r}
randomness = dict(seed=0)
load_from = None
train_cfg = dict(max_epochs={args.epochs})
val_cfg = None
val_dataloader = None
val_evaluator = None
default_hooks = dict(logger=dict(interval={args.log_interval}),
                     checkpoint=dict(interval={args.epochs}, max_keep_ckpts=1))
log_processor = dict(window_size={args.log_interval})
train_dataloader = dict(batch_size={BATCH_PER_GPU}, {loader},
                        dataset=dict(data_root={root!r}))
test_dataloader = dict(batch_size=1, {loader}, dataset=dict(data_root={root!r}))
"""
    with open(path, 'w') as f:
        f.write(text + memory_hook_text(CONFIG))
    if args.resize:
        with open(path, 'a') as f:
            f.write(resized_pipelines(path, args.resize))
    return path


# ---- processes ----------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def process_env(args):
    env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable, PORT=str(free_port()))
    env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, env.get('PYTHONPATH')) if p)
    if args.cpu:
        env['CUDA_VISIBLE_DEVICES'] = ''
    return env


def train_command(args, config, work_dir, gpus, batch, epochs):
    tool = (['bash', osp.join(REPO, 'tools/dist_train.sh'), config, str(gpus)] if gpus > 1 else
            [sys.executable, osp.join(REPO, 'tools/train.py'), config])
    return tool + ['--work-dir', work_dir, '--auto-scale-lr'] + ([] if args.cpu else ['--amp']) + [
        '--cfg-options', f'train_dataloader.batch_size={batch}', f'train_cfg.max_epochs={epochs}',
        f'default_hooks.checkpoint.interval={epochs}',
        f'model.cuda_graph_step={not args.eager_step}']


def test_command(config, checkpoint, work_dir, gpus):
    tool = (['bash', osp.join(REPO, 'tools/dist_test.sh'), config, checkpoint, str(gpus)]
            if gpus > 1 else [sys.executable, osp.join(REPO, 'tools/test.py'), config, checkpoint])
    return tool + ['--work-dir', work_dir, '--out', osp.join(work_dir, 'detections.pkl')]


def time_left(args, deadline):
    return args.timeout if deadline is None else max(1, min(args.timeout,
                                                            int(deadline - time.time())))


# ---- runs ---------------------------------------------------------------------------------------
def train_and_test(run, args, config, gpus, batch, epochs, deadline):
    """Trains on `gpus` GPUs with `batch` per GPU, then tests the last checkpoint on 1 GPU."""
    work_dir = osp.join(args.work_root, run)
    test_dir = work_dir + '_test'
    for folder in (work_dir, test_dir):  # (an earlier run's logs would mix into this one's)
        shutil.rmtree(folder, ignore_errors=True)
    command = train_command(args, config, work_dir, gpus, batch, epochs)
    result = dict(gpus=gpus, batch_per_gpu=batch, epochs=epochs, train_command=' '.join(command))
    log = osp.join(args.log_dir, f'train_{run}.log')
    rc, result['train_wall_s'] = run_logged(command, log, time_left(args, deadline),
                                            process_env(args))
    if rc != 0:
        return dict(result, error=f'training rc={rc}', log_tail=tail(log))
    result['train'] = train_summary(work_dir, gpus * batch, args.skip)
    checkpoint = osp.join(work_dir, f'epoch_{epochs}.pth')
    result['checkpoint'] = checkpoint
    if run == 'speed_1gpu':
        return result
    command = test_command(config, checkpoint, test_dir, 1)
    result['test_command'] = ' '.join(command)
    log = osp.join(args.log_dir, f'test_{run}.log')
    rc, result['test_wall_s'] = run_logged(command, log, time_left(args, deadline),
                                           process_env(args))
    if rc != 0:
        return dict(result, error=f'test rc={rc}', log_tail=tail(log))
    result['test'] = test_summary(test_dir)
    result['detections'] = osp.join(test_dir, 'detections.pkl')
    return result


def dist_test(args, config, trained, deadline):
    """tools/dist_test.sh on 2 GPUs with dist2's checkpoint, against dist2's 1-GPU test."""
    if 'detections' not in trained:
        return dict(skipped='dist2 has no checkpoint and 1-GPU detections')
    test_dir = osp.join(args.work_root, 'dist2_test')
    shutil.rmtree(test_dir, ignore_errors=True)
    command = test_command(config, trained['checkpoint'], test_dir, 2)
    result = dict(test_command=' '.join(command))
    log = osp.join(args.log_dir, 'test_dist2_test.log')
    rc, result['test_wall_s'] = run_logged(command, log, time_left(args, deadline),
                                           process_env(args))
    if rc != 0:
        return dict(result, error=f'test rc={rc}', log_tail=tail(log))
    result['test'] = test_summary(test_dir)
    result['against_1gpu_test'] = compare_detections(
        trained['detections'], osp.join(test_dir, 'detections.pkl'))
    return result


def compare_detections(one_path, two_path):
    """Image by image: the same images in the same order, each once, and how far the detections
    are apart (identical: same count, boxes, scores and labels exactly)."""
    with open(one_path, 'rb') as f:
        one = pickle.load(f)
    with open(two_path, 'rb') as f:
        two = pickle.load(f)
    ids_one, ids_two = [r['img_id'] for r in one], [r['img_id'] for r in two]
    result = dict(images=len(ids_one), images_2gpu=len(ids_two),
                  each_image_once=len(set(ids_two)) == len(ids_two),
                  same_images_in_order=ids_one == ids_two)
    counts_differ, box_diff, score_diff, labels_differ, identical = 0, 0.0, 0.0, 0, True
    for a, b in zip(one, two):
        a, b = a['pred_instances'], b['pred_instances']
        if len(a['scores']) != len(b['scores']):
            counts_differ += 1
            identical = False
            continue
        if len(a['scores']) == 0:
            continue
        boxes = (a['bboxes'].float() - b['bboxes'].float()).abs().max().item()
        scores = (a['scores'].float() - b['scores'].float()).abs().max().item()
        labels = int((a['labels'] != b['labels']).sum())
        box_diff, score_diff = max(box_diff, boxes), max(score_diff, scores)
        labels_differ += labels
        identical = identical and boxes == 0 and scores == 0 and labels == 0
    return dict(result, images_with_other_counts=counts_differ, max_abs_box_difference=box_diff,
                max_abs_score_difference=score_diff, labels_differing=labels_differ,
                identical=identical and result['same_images_in_order'])


# ---- comparison ---------------------------------------------------------------------------------
def side_by_side(runs):
    def get(run, *keys):
        value = runs.get(run)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    one, two = get('speed_1gpu', 'train', 'images_per_s'), get('dist2', 'train', 'images_per_s')
    map_one, map_two = get('map_1gpu', 'test', 'mAP50'), get('dist2', 'test', 'mAP50')
    scaling = round(two / one, 3) if one and two else None
    difference = round(map_two - map_one, 4) if None not in (map_one, map_two) else None
    equal = get('dist2_test', 'against_1gpu_test')
    table = dict(
        images_per_s={'1gpu_batch2': one, '2gpu_2x2': two,
                      '1gpu_batch4': get('map_1gpu', 'train', 'images_per_s')},
        scaling_2gpu_over_1gpu=scaling,
        mAP50={'1gpu_batch4': map_one, '2gpu_2x2': map_two},
        mAP50_2gpu_minus_1gpu=difference,
        peak_memory_mb={'1gpu_batch2': get('speed_1gpu', 'train', 'peak_memory_mb'),
                        '2gpu_2x2_rank0': get('dist2', 'train', 'peak_memory_mb')},
        dist_test_mAP50={'1gpu': map_two, '2gpu': get('dist2_test', 'test', 'mAP50')})
    goals = dict(
        scaling_at_least_1_9x=None if scaling is None else scaling >= GOALS['scaling'],
        same_map_within_0_01=(None if difference is None
                              else abs(difference) <= GOALS['map_difference']),
        dist_test_gives_1gpu_detections=None if equal is None else equal['identical'])
    return dict(side_by_side=table, goals=goals)


def main(argv=None):
    args = parse_args(argv)
    import torch
    start = time.time()
    deadline = start + args.budget_s if args.budget_s else None
    gpus = 2 if args.cpu else torch.cuda.device_count()
    os.makedirs(args.log_dir, exist_ok=True)
    images = ensure_data(args, process_env(args))
    config = write_config(args, osp.join(args.log_dir, 'multi_gpu.py'))
    result = dict(
        what='ReDet R50 (ReResNet-50 + ReFPN) at 1024 x 1024 on 1 and 2 GPUs: tools/train.py vs '
             'tools/dist_train.sh, ' + ('CUDA-graph features' if args.eager_step else
                                         'the captured training step') +
             ' + AMP, trained from scratch on synthetic '
             'DOTA-format images (benchmarks/detector/bench_multi_gpu.py)',
        command=' '.join(['python -m benchmarks.detector.bench_multi_gpu']
                         + (argv if argv is not None else sys.argv[1:])),
        environment=environment(0 if args.cpu else gpus),
        settings=dict(config=osp.relpath(CONFIG, REPO), batch_per_gpu=BATCH_PER_GPU,
                      total_batch_2gpu=2 * BATCH_PER_GPU, epochs=args.epochs,
                      speed_epochs=args.speed_epochs, amp=not args.cpu,
                      cuda_graph_features=not args.cpu, cuda_graph_step=not args.eager_step,
                      auto_scale_lr=True,
                      log_interval=args.log_interval, skip=args.skip, workers=args.workers,
                      resize=args.resize or 1024, data_root=args.data_root, images=images,
                      cpu_check=args.cpu),
        runs={})
    plans = dict(speed_1gpu=(1, BATCH_PER_GPU, args.speed_epochs),
                 dist2=(2, BATCH_PER_GPU, args.epochs),
                 map_1gpu=(1, 2 * BATCH_PER_GPU, args.epochs))
    for run in args.runs:
        left = None if deadline is None else deadline - time.time()
        needs = 1 if run in ('speed_1gpu', 'map_1gpu') else 2
        if left is not None and left < MIN_RUN_S:
            outcome = dict(skipped=f'budget: {left:.0f} s left of --budget-s')
        elif gpus < needs:
            outcome = dict(skipped=f'{gpus} GPU(s); this run needs {needs}')
        elif run == 'dist2_test':
            outcome = dist_test(args, config, result['runs'].get('dist2', {}), deadline)
        else:
            outcome = train_and_test(run, args, config, *plans[run], deadline)
        result['runs'][run] = outcome
        if 'error' in outcome:
            print(f"{run}: {outcome['error']}\n{outcome['log_tail']}", flush=True)
        elif 'skipped' in outcome:
            print(f"{run}: skipped ({outcome['skipped']})", flush=True)
        else:
            print(f"{run}: {outcome.get('train', {}).get('images_per_s')} images/s, mAP "
                  f"{outcome.get('test', {}).get('mAP50')}", flush=True)
        result.update(side_by_side(result['runs']), wall_s=round(time.time() - start))
        with open(args.out, 'w') as f:  # after every run: a cut call keeps the finished runs
            json.dump(result, f, indent=1)
    print(json.dumps(dict(side_by_side=result['side_by_side'], goals=result['goals']), indent=1))


if __name__ == '__main__':
    main()
