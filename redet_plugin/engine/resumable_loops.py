"""mmengine's train loops, resumed where they stopped: a run killed after a checkpoint and resumed
from it ends with the weights of the run that was never stopped.

What mmengine 0.10 leaves out, and these loops add:
- the data position. mmengine's IterBasedTrainLoop reaches it by loading every batch trained
  before the checkpoint (hours on DOTA), and its EpochBasedTrainLoop starts the epoch of a
  mid-epoch checkpoint again from its first batch. Here the batch sampler
  (ResumableBatchSampler, put around the configured sampler and batch sampler) skips the
  batches without loading them; the sampler's seed and epoch are mmengine's, so the order is
  the uninterrupted run's.
- the random generators. A checkpoint keeps the states of Python's `random`, numpy's and
  torch's generators (CPU and CUDA; TrainStateHook), and the resumed loop puts them back at the
  point of the data stream where they were saved. Validation runs with the generators put back
  afterwards, so that it does not move the training's draws.
- the augmentations. Loader workers seed their generators when they start, and a resumed run
  starts new ones. ResumableBatchSampler hands the data set each index as a DrawIndex with a
  seed of its place in the stream, and the data sets of redet_plugin run the pipeline of such an
  index from that seed (redet_plugin/datasets/draws.py): the same draws whatever process, and
  whatever num_workers, prepares the sample.
The learning rate, optimizer and message hub are mmengine's (saved and resumed by its Runner).

Configs name them `train_cfg = dict(type='RedetIterBasedTrainLoop', ...)` or
'RedetEpochBasedTrainLoop' (same arguments as mmengine's); tools/train.py runs a config's
mmengine IterBasedTrainLoop / EpochBasedTrainLoop as these (resumable_train_cfg).
"""
import contextlib
import random
import time
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from mmdet.registry import DATA_SAMPLERS, HOOKS, LOOPS
from mmengine.dataset import InfiniteSampler
from mmengine.dist import get_dist_info
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.runner.loops import BaseLoop, calc_dynamic_intervals
from mmengine.runner.loops import EpochBasedTrainLoop as MMEngineEpochBasedTrainLoop
from mmengine.runner.loops import IterBasedTrainLoop as MMEngineIterBasedTrainLoop
from torch.utils.data import BatchSampler, DataLoader

from ..datasets.draws import DrawIndex, draw_seed
from ..utils.registration import register

CHECKPOINT_KEY = 'redet_rng_state'


# ---- random generator states ---------------------------------------------------------------
def rng_state() -> dict:
    """The states of Python's, numpy's and torch's (CPU, and CUDA where started) generators, in
    types torch.load(weights_only=True) reads."""
    version, keys, gauss = random.getstate()
    kind, np_keys, np_pos, has_gauss, cached = np.random.get_state()
    state = dict(python=dict(version=version, keys=torch.tensor(keys, dtype=torch.int64),
                             gauss=gauss),
                 numpy=dict(kind=kind, keys=torch.from_numpy(np_keys.astype(np.int64)),
                            pos=int(np_pos), has_gauss=int(has_gauss), cached=float(cached)),
                 torch=torch.random.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Puts back the states rng_state() returned. mmengine's resume loads a checkpoint onto the
    current device, so the states may come back as CUDA tensors: the generators take CPU ones."""
    py = state['python']
    random.setstate((py['version'], tuple(int(k) for k in py['keys'].tolist()), py['gauss']))
    npy = state['numpy']
    np.random.set_state((npy['kind'], npy['keys'].cpu().numpy().astype(np.uint32), npy['pos'],
                         npy['has_gauss'], npy['cached']))
    torch.random.set_rng_state(state['torch'].cpu())
    if state.get('cuda') is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state['cuda']])


@contextlib.contextmanager
def kept_rng():
    """Runs the block with the random generators put back as they were afterwards."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@register(HOOKS)
class TrainStateHook(Hook):
    """Saves the random generators' states in every checkpoint, and hands those of a loaded one
    to the resumable loop (which puts them back where the data stream stood when they were
    saved; a checkpoint loaded with load_from, iteration 0, leaves them alone). The loops of
    this module add it to the runner themselves."""

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = rng_state()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        loop = getattr(runner, '_train_loop', None)
        if isinstance(loop, _Resumable):
            loop._saved_rng = checkpoint.get(CHECKPOINT_KEY)


# ---- the batch sampler -------------------------------------------------------------------------
@register(DATA_SAMPLERS)
class ResumableBatchSampler:
    """The configured batch sampler (or torch's BatchSampler over `sampler`), whose next pass can
    start after n batches without loading them (skip_next), and whose indices are DrawIndexes
    seeded by (sampler seed, rank, sampler epoch, batch in the pass, place in the batch).

    Args:
        sampler: the data loader's sampler (mmengine's DefaultSampler, InfiniteSampler, ...).
        batch_size: samples per batch.
        batch_sampler: the config's batch sampler (e.g. mmdet's AspectRatioBatchSampler), built
            with `sampler` and `batch_size`; None: torch's BatchSampler.
        drop_last: for torch's BatchSampler (a configured batch sampler has its own).
    """

    def __init__(self, sampler, batch_size: int, batch_sampler: Optional[dict] = None,
                 drop_last: bool = False) -> None:
        if batch_sampler is None:
            self.batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        elif isinstance(batch_sampler, dict):
            self.batch_sampler = DATA_SAMPLERS.build(
                batch_sampler, default_args=dict(sampler=sampler, batch_size=batch_size))
        else:
            self.batch_sampler = batch_sampler
        self.sampler = sampler  # (DistSamplerSeedHook sets its epoch through this attribute)
        self.batch_size = batch_size
        seed = getattr(sampler, 'seed', None)
        self.seed = 0 if seed is None else int(seed)
        self.rank = get_dist_info()[0]
        self._skip = 0

    def skip_next(self, batches: int) -> None:
        """The next pass starts after `batches` batches (drawn, not loaded)."""
        self._skip = int(batches)

    def batches_per_pass(self) -> Optional[int]:
        """The batches of one pass; None for an InfiniteSampler's, which never ends. (A batch
        sampler may keep state between the batches of a pass, as mmdet's
        AspectRatioBatchSampler keeps its buckets: a pass is never begun only to count it.)"""
        return None if isinstance(self.sampler, InfiniteSampler) else len(self.batch_sampler)

    def __iter__(self):
        skip, self._skip = self._skip, 0
        epoch = int(getattr(self.sampler, 'epoch', 0) or 0)
        for number, batch in enumerate(self.batch_sampler):
            if number < skip:
                continue
            yield [DrawIndex(int(index), draw_seed((self.seed, self.rank, epoch, number, place)))
                   for place, index in enumerate(batch)]

    def __len__(self) -> int:
        return len(self.batch_sampler)


def resumable_loader(dataloader: Union[DataLoader, dict]) -> Union[DataLoader, dict]:
    """A train_dataloader config whose batches come from a ResumableBatchSampler around its
    sampler and batch sampler. A built DataLoader, or one whose batch sampler is an object, is
    returned as it is (its batches are then skipped by loading them, as mmengine does)."""
    if not isinstance(dataloader, dict):
        return dataloader
    batch_sampler = dataloader.get('batch_sampler')
    if batch_sampler is not None and not isinstance(batch_sampler, dict):
        return dataloader
    if isinstance(batch_sampler, dict) and batch_sampler.get('type') in (
            ResumableBatchSampler, 'RedetResumableBatchSampler'):
        return dataloader
    dataloader = dict(dataloader)
    # (torch refuses drop_last next to a batch sampler: it goes into torch's BatchSampler)
    dataloader['batch_sampler'] = dict(type=ResumableBatchSampler, batch_sampler=batch_sampler,
                                       drop_last=dataloader.pop('drop_last', False))
    return dataloader


def _set_epoch(loader: DataLoader, epoch: int) -> None:
    """The sampler's epoch, as mmengine's _InfiniteDataloaderIterator sets it."""
    if hasattr(loader, 'sampler') and hasattr(loader.sampler, 'set_epoch'):
        loader.sampler.set_epoch(epoch)
    elif hasattr(loader, 'batch_sampler') and hasattr(loader.batch_sampler.sampler, 'set_epoch'):
        loader.batch_sampler.sampler.set_epoch(epoch)


class DataStream:
    """mmengine's _InfiniteDataloaderIterator (the loader pass after pass, the sampler's epoch
    set to the pass number from the second pass on), able to start after any number of batches
    (start)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.passes = 0
        self._iterator = None

    def start(self, batches: int = 0) -> Tuple[int, int]:
        """Makes the iterator, `batches` batches into the stream; returns (pass, batch in it).
        With a ResumableBatchSampler the batches are drawn, not loaded; else they are loaded."""
        batch_sampler = getattr(self.loader, 'batch_sampler', None)
        if batches <= 0 or not isinstance(batch_sampler, ResumableBatchSampler):
            self._iterator = iter(self.loader)
            for _ in range(max(batches, 0)):  # (mmengine's way: load and drop them)
                next(self)
            return self.passes, batches
        per_pass = batch_sampler.batches_per_pass()
        if not per_pass:
            within = batches
        else:  # (a pass that ended with the last batch trained: the next one starts later, as it did)
            self.passes, within = divmod(batches - 1, per_pass)
            within += 1
            if self.passes:
                _set_epoch(self.loader, self.passes)
        batch_sampler.skip_next(within)
        self._iterator = iter(self.loader)
        return self.passes, within

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            self.passes += 1
            _set_epoch(self.loader, self.passes)
            if self.loader.num_workers:
                time.sleep(2)  # (mmengine: against a deadlock of the workers between passes)
            self._iterator = iter(self.loader)
            return next(self._iterator)


class _Resumable:
    """What both loops share: the state hook, the saved generators, validation kept apart."""

    _saved_rng: Optional[dict] = None
    _rng_pending = True  # (the first start of the data after run() began)

    def _add_state_hook(self, runner) -> None:
        if not any(isinstance(hook, TrainStateHook) for hook in runner.hooks):
            runner.register_hook(TrainStateHook())

    def _put_back_rng(self) -> None:
        """The generators as the checkpoint saved them (once, after a resume)."""
        if not self._rng_pending:
            return
        self._rng_pending = False
        state, self._saved_rng = self._saved_rng, None
        if state is not None and self._iter > 0:
            set_rng_state(state)
        elif self._iter > 0:
            print_log('the checkpoint holds no random generator states (saved by another loop): '
                      'the random draws after the resume differ from those of a run that was not '
                      'stopped', logger='current', level=30)

    def _validate(self) -> None:
        with kept_rng():
            self.runner.val_loop.run()


@register(LOOPS)
class IterBasedTrainLoop(_Resumable, MMEngineIterBasedTrainLoop):
    """mmengine's IterBasedTrainLoop (same arguments), resumed at the batch and with the random
    draws of the run it continues (see the module's docstring)."""

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], max_iters: int,
                 val_begin: int = 1, val_interval: int = 1000,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None) -> None:
        # mmengine's __init__, except that the data iterator (whose workers start and prefetch at
        # once) is made in run(), when a resume has said where the data stand
        BaseLoop.__init__(self, runner, resumable_loader(dataloader))
        self._max_iters = int(max_iters)
        if self._max_iters != max_iters:
            raise ValueError(f'max_iters must be an integer, got {max_iters}')
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.val_begin = val_begin
        self.val_interval = val_interval
        self.stop_training = False
        if hasattr(self.dataloader.dataset, 'metainfo'):
            self.runner.visualizer.dataset_meta = self.dataloader.dataset.metainfo
        self.dataloader_iterator = DataStream(self.dataloader)
        self.dynamic_milestones, self.dynamic_intervals = calc_dynamic_intervals(
            self.val_interval, dynamic_intervals)
        self._add_state_hook(runner)

    def run(self):
        self._rng_pending = True
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        position = self.dataloader_iterator.start(self._iter)
        if self._iter > 0:
            print_log(f'resumed at iteration {self._iter}: the data continue after batch '
                      f'{position[1]} of pass {position[0] + 1}', logger='current')
        # (the iterator of the pass was made before the checkpoint in the run that saved it)
        self._put_back_rng()
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            data_batch = next(self.dataloader_iterator)
            self.run_iter(data_batch)
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._iter >= self.val_begin
                    and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
                self._validate()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model


@register(LOOPS)
class EpochBasedTrainLoop(_Resumable, MMEngineEpochBasedTrainLoop):
    """mmengine's EpochBasedTrainLoop (same arguments), resumed at the batch (also within an
    epoch, from a checkpoint saved by iteration) and with the random draws of the run it
    continues (see the module's docstring)."""

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], max_epochs: int,
                 val_begin: int = 1, val_interval: int = 1,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None) -> None:
        super().__init__(runner, resumable_loader(dataloader), max_epochs, val_begin,
                         val_interval, dynamic_intervals)
        self._add_state_hook(runner)

    def run(self):
        self._rng_pending = True
        self.runner.call_hook('before_train')
        while self._epoch < self._max_epochs and not self.stop_training:
            self.run_epoch()
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._epoch >= self.val_begin
                    and (self._epoch % self.val_interval == 0 or self._epoch == self._max_epochs)):
                self._validate()
        self.runner.call_hook('after_train')
        return self.runner.model

    def run_epoch(self) -> None:
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        # batches of this epoch trained before the checkpoint (0 unless saved within the epoch)
        done = min(max(self._iter - self._epoch * len(self.dataloader), 0), len(self.dataloader))
        if done == 0:  # the run that saved the checkpoint made this epoch's iterator after it
            self._put_back_rng()
        batch_sampler = getattr(self.dataloader, 'batch_sampler', None)
        if done > 0 and isinstance(batch_sampler, ResumableBatchSampler):
            batch_sampler.skip_next(done)  # (drawn, not loaded)
            iterator = iter(self.dataloader)
        else:
            iterator = iter(self.dataloader)
            for _ in range(done):  # (mmengine's way: load and drop them)
                next(iterator)
        if done > 0:
            print_log(f'resumed at iteration {self._iter}: epoch {self._epoch + 1} continues at '
                      f'its batch {done + 1}', logger='current')
            self._put_back_rng()
        for idx, data_batch in enumerate(iterator, start=done):
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1


def resumable_train_cfg(train_cfg: Optional[dict]) -> Optional[dict]:
    """A config's train_cfg with mmengine's IterBasedTrainLoop / EpochBasedTrainLoop (by type, or
    by_epoch without a type) replaced by those of this module ('mmdet.RedetIterBasedTrainLoop',
    'mmdet.RedetEpochBasedTrainLoop'); other loops are kept."""
    if not train_cfg:
        return train_cfg
    train_cfg = dict(train_cfg)
    kind = train_cfg.get('type')
    if kind is None and 'by_epoch' in train_cfg:
        kind = 'EpochBasedTrainLoop' if train_cfg.pop('by_epoch') else 'IterBasedTrainLoop'
    names = {'IterBasedTrainLoop': IterBasedTrainLoop, 'EpochBasedTrainLoop': EpochBasedTrainLoop}
    if isinstance(kind, str) and kind.split('.')[-1] in names:
        # (scoped: found also from another default_scope, e.g. mmrotate's)
        train_cfg['type'] = 'mmdet.Redet' + kind.split('.')[-1]
    elif kind in (MMEngineIterBasedTrainLoop, MMEngineEpochBasedTrainLoop):
        train_cfg['type'] = names[kind.__name__]
    return train_cfg


__all__ = ['DataStream', 'EpochBasedTrainLoop', 'IterBasedTrainLoop', 'ResumableBatchSampler',
           'TrainStateHook', 'kept_rng', 'resumable_loader', 'resumable_train_cfg', 'rng_state',
           'set_rng_state']
