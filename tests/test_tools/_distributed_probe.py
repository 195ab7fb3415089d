"""Loaded by the configs of tests/test_tools/test_distributed.py through custom_imports, in every
training process: a sampler whose draws depend on the image alone, and a hook that records one
optimizer step.

The RPN and RoI samplers draw from the process's torch RNG. Two DDP processes each draw for their
own image from the same seed, while one process given both images draws for the second image
where the first left the RNG: the runs would sample other anchors and RoIs by design, not by a
bug. ImageSeededRandomSampler seeds each draw from what it draws from (the candidate indices,
which come from the image), so every image gets the same samples in any process.
"""
import os.path as osp

import torch
from mmdet.models.task_modules.samplers import RandomSampler
from mmdet.registry import HOOKS, TASK_UTILS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper


class ImageSeededRandomSampler(RandomSampler):
    """mmdet's RandomSampler (drawn by redet_plugin's fixed-size masks) with keys seeded by the
    image's assignment (its size and sum) and the draw's size."""

    def draw_keys(self, gt_inds):
        seed = (gt_inds.numel() * 1000003 + int(gt_inds.sum()) * 31 + self.num) % (2 ** 31)
        keys = torch.rand(gt_inds.shape, generator=torch.Generator().manual_seed(seed))
        return keys.to(gt_inds.device)


class StepRecordHook(Hook):
    """Saves, per rank, the parameters and learning rates before training, the gradients the
    optimizer steps with
    (after DDP's averaging and gradient clipping) and the parameters after training, to
    <work_dir>/rank<k>.pt. Meant for runs with one optimizer step."""

    def __init__(self):
        self.record = {}

    @staticmethod
    def _named_parameters(runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        return list(model.named_parameters())

    def before_train(self, runner):
        named = self._named_parameters(runner)
        self.record['before'] = {n: p.detach().clone() for n, p in named}
        self.record['steps'] = 0
        self.record['lr'] = runner.optim_wrapper.get_lr()['lr']

        def grads(optimizer, args, kwargs):
            self.record['steps'] += 1
            self.record['grads'] = {n: p.grad.detach().clone() for n, p in named
                                    if p.grad is not None}

        runner.optim_wrapper.optimizer.register_step_pre_hook(grads)

    def after_train(self, runner):
        self.record['after'] = {n: p.detach().clone() for n, p in self._named_parameters(runner)}
        self.record['world_size'] = runner.world_size
        torch.save(self.record, osp.join(runner.work_dir, f'rank{runner.rank}.pt'))


TASK_UTILS.register_module(name='ImageSeededRandomSampler', module=ImageSeededRandomSampler,
                           force=True)
HOOKS.register_module(name='StepRecordHook', module=StepRecordHook, force=True)
