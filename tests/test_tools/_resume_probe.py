"""A hook for the tests that kill and resume a training (custom_imports of their config): per
iteration, one line in <work_dir>/probe.jsonl with what the iteration trains on (image ids, a
fingerprint of the augmented images and boxes) and its learning rate.
REDET_TEST_PAUSE_AT=<iteration> (read by this hook only) makes the run wait there for a minute,
for the test to kill it mid-way between two checkpoints."""
import json
import os
import os.path as osp
import time

from mmdet.registry import HOOKS
from mmengine.hooks import Hook


@HOOKS.register_module(force=True)
class ResumeProbeHook(Hook):
    priority = 'NORMAL'

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        iteration = runner.iter + 1
        samples = data_batch['data_samples']
        record = dict(
            iter=iteration, pid=os.getpid(),
            lr=runner.optim_wrapper.get_lr()['lr'][0],
            img_ids=[s.metainfo['img_id'] for s in samples],
            pixels=[float(img.double().sum()) for img in data_batch['inputs']],
            boxes=[float(s.gt_instances.bboxes.tensor.double().sum()) for s in samples])
        with open(osp.join(runner.work_dir, 'probe.jsonl'), 'a') as f:
            f.write(json.dumps(record) + '\n')
        if os.environ.get('REDET_TEST_PAUSE_AT') == str(iteration):
            time.sleep(60)
