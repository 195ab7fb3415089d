"""CheckpointHook (registered as 'RedetCheckpointHook'): mmengine's, with the order of its writes
made safe against a kill.

mmengine 0.10's CheckpointHook (1) writes `last_checkpoint` with a plain open(..., 'w'): a run
killed in that write leaves it empty or cut, and `--resume` then finds no checkpoint and starts
from scratch without a word; (2) with max_keep_ckpts, removes the oldest checkpoint before it
saves the new one: with max_keep_ckpts=1 a kill during the save leaves `last_checkpoint` naming a
removed file. Here the new checkpoint is saved (whole or not at all, with the configs' atomic
backend: atomic_local_backend.py), then `last_checkpoint` is replaced atomically by one naming
it, and only then is the oldest checkpoint removed. Arguments: mmengine's.
"""
import os.path as osp

from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook as MMEngineCheckpointHook

from ..utils.registration import register
from .atomic_local_backend import atomic_write


@register(HOOKS)
class CheckpointHook(MMEngineCheckpointHook):

    def _save_checkpoint_with_step(self, runner, step, meta):
        outdated = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()  # removed once the new one is named
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():
            return
        atomic_write(str(self.last_ckpt).encode(), osp.join(runner.work_dir, 'last_checkpoint'))
        if outdated is not None:
            path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(outdated))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # (deepspeed's checkpoints are folders)
                self.file_backend.rmtree(path)
