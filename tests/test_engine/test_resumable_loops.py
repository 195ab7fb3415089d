"""RedetIterBasedTrainLoop / RedetEpochBasedTrainLoop (redet_plugin/engine/resumable_loops.py): a
run stopped after a checkpoint and resumed trains on the batches, with the augmentation draws and
the model's random draws, of the run that was never stopped, whatever num_workers, sampler and
loop; the skipped batches are drawn, not loaded. A toy model, in one process."""
import random
import uuid

import numpy as np
import pytest
import torch
from mmdet.datasets.samplers import AspectRatioBatchSampler
from mmengine.dataset import BaseDataset
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner

import redet_plugin.mm  # noqa: F401
from redet_plugin.datasets import BadImagesMixin, DrawIndex
from redet_plugin.engine import (CheckpointHook, EpochBasedTrainLoop, IterBasedTrainLoop,
                                 ResumableBatchSampler)
from redet_plugin.engine.resumable_loops import DataStream, resumable_train_cfg

LOADED = []  # indices whose pipeline ran in this process


class Draws:
    """A pipeline step drawing from the three global generators, as augmentations do."""

    def __call__(self, results):
        LOADED.append(results['sample_idx'])
        draw = random.random() + float(np.random.rand()) + float(torch.rand(()))
        results['inputs'] = torch.tensor([results['x'], draw], dtype=torch.float32)
        results['draw'] = draw
        return results


class ToyDataset(BadImagesMixin, BaseDataset):
    def __init__(self, size=10, **kwargs):
        self.size = size
        self._set_on_bad_image('error')
        super().__init__(pipeline=[Draws()], serialize_data=False, **kwargs)

    def load_data_list(self):  # (width, height for mmdet's AspectRatioBatchSampler)
        return [dict(x=float(i), width=10 + i % 3, height=11) for i in range(self.size)]


class ToyModel(BaseModel):
    """A linear layer behind dropout: its steps draw from torch's generator."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, inputs, mode='loss', **kwargs):
        out = self.linear(self.dropout(torch.stack(inputs)))
        return dict(loss=((out - 1) ** 2).mean()) if mode == 'loss' else [out]


class _Killed(Exception):
    pass


class Probe(Hook):
    priority = 'HIGHEST'

    def __init__(self, records, stop_at=None):
        self.records, self.stop_at = records, stop_at

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter + 1 == self.stop_at:
            raise _Killed()
        self.records[runner.iter + 1] = dict(
            samples=[int(i) for i in data_batch['sample_idx']], draws=list(data_batch['draw']),
            lr=runner.optim_wrapper.get_lr()['lr'][0])


def _train(work_dir, loop, records, stop_at=None, resume=False, workers=0,
           sampler='InfiniteSampler', batch_sampler=None):
    train_cfg = (dict(type=IterBasedTrainLoop, max_iters=9, val_interval=100) if loop == 'iter'
                 else dict(type=EpochBasedTrainLoop, max_epochs=3))  # (3 epochs of 4 batches)
    checkpoint = dict(type=CheckpointHook, interval=3, by_epoch=False)  # (within epochs, too)
    runner = Runner(
        model=dict(type=ToyModel), work_dir=str(work_dir), experiment_name=uuid.uuid4().hex,
        train_dataloader=dict(dataset=dict(type=ToyDataset, size=8), batch_size=2,
                              sampler=dict(type=sampler, shuffle=True), batch_sampler=batch_sampler,
                              # (persistent workers of a stopped epoch take seconds to shut down)
                              num_workers=workers, persistent_workers=workers > 0 and loop == 'iter',
                              collate_fn=dict(type='pseudo_collate')),
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(type='MultiStepLR', by_epoch=False, milestones=[5], gamma=0.1),
        default_hooks=dict(checkpoint=checkpoint, logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[Probe(records, stop_at)], randomness=dict(seed=0), resume=resume)
    try:
        runner.train()
    except _Killed:
        return None
    finally:  # the persistent workers, now (collected in a later test, they take seconds)
        stream = getattr(runner.train_loop, 'dataloader_iterator', None)
        iterator = getattr(stream, '_iterator', None)
        if hasattr(iterator, '_shutdown_workers'):
            iterator._shutdown_workers()
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


@pytest.mark.parametrize('loop, workers, sampler, batch_sampler', [
    ('iter', 0, 'InfiniteSampler', None),
    ('iter', 2, 'InfiniteSampler', None),
    ('iter', 0, 'DefaultSampler', None),  # passes end: the resume lands in the third
    ('iter', 0, 'DefaultSampler', dict(type=AspectRatioBatchSampler)),
    ('epoch', 0, 'DefaultSampler', None),  # the checkpoint of iteration 6, in the second epoch
    ('epoch', 2, 'DefaultSampler', None),
])
def test_stopped_and_resumed_run_is_the_uninterrupted_one(tmp_path, loop, workers, sampler,
                                                          batch_sampler):
    whole, parts = {}, {}
    expected = _train(tmp_path / 'whole', loop, whole, workers=workers, sampler=sampler,
                      batch_sampler=batch_sampler)
    assert _train(tmp_path / 'parts', loop, parts, stop_at=8, workers=workers, sampler=sampler,
                  batch_sampler=batch_sampler) is None  # stopped after the checkpoint of iteration 6
    del LOADED[:]
    resumed = {}
    weights = _train(tmp_path / 'parts', loop, resumed, resume=True, workers=workers,
                     sampler=sampler, batch_sampler=batch_sampler)
    assert sorted(resumed) == list(range(7, len(whole) + 1))
    if workers == 0:  # the skipped batches were not loaded
        assert len(LOADED) == 2 * len(resumed)
    for iteration, record in {**parts, **resumed}.items():
        assert record == whole[iteration], iteration
    for name, value in expected.items():
        assert torch.equal(weights[name], value), name


def test_checkpoints_of_mmengines_loops_resume_with_a_warning(tmp_path, capsys):
    """A checkpoint without the generators' states (mmengine's loop saved it) resumes at the
    right batch; the draws then differ, and the log says so."""
    records = {}
    _train(tmp_path, 'iter', records, stop_at=5)
    checkpoint = tmp_path / 'iter_3.pth'
    saved = torch.load(checkpoint, weights_only=True)
    saved.pop('redet_rng_state')
    torch.save(saved, checkpoint)
    resumed = {}
    _train(tmp_path, 'iter', resumed, resume=True)
    assert sorted(resumed) == list(range(4, 10))
    assert resumed[4]['samples'] == records[4]['samples']
    assert 'the checkpoint holds no random generator states' in capsys.readouterr().out


@pytest.mark.parametrize('sampler, batch_sampler, per_pass', [
    ('InfiniteSampler', None, None), ('DefaultSampler', None, 4),
    ('DefaultSampler', AspectRatioBatchSampler, 4)])
def test_data_stream_starts_anywhere_with_the_batches_of_an_unbroken_stream(sampler, batch_sampler,
                                                                            per_pass):
    from mmengine.dataset import DefaultSampler, InfiniteSampler, pseudo_collate
    from torch.utils.data import DataLoader

    def loader():
        dataset = ToyDataset(size=8)
        inner = (InfiniteSampler if sampler == 'InfiniteSampler' else DefaultSampler)(
            dataset, shuffle=True, seed=3)
        batches = ResumableBatchSampler(inner, 2, batch_sampler and dict(type=batch_sampler))
        return DataLoader(dataset, batch_sampler=batches, collate_fn=pseudo_collate)

    def batches(stream, count):
        return [([int(i) for i in batch['sample_idx']], batch['draw'])
                for batch, _ in zip(stream, range(count))]
    full = DataStream(loader())
    full.start(0)
    unbroken = batches(full, 11)
    for start in (1, 4, 5, 8, 9):
        stream = DataStream(loader())
        position = stream.start(start)  # (pass, batches of it done): a pass ends, then the next begins
        assert position == ((0, start) if per_pass is None else
                            ((start - 1) // per_pass, (start - 1) % per_pass + 1))
        assert batches(stream, 11 - start) == unbroken[start:], start


def test_indices_carry_seeds_of_their_place_in_the_stream():
    from mmengine.dataset import DefaultSampler
    dataset = ToyDataset(size=6)
    sampler = DefaultSampler(dataset, shuffle=True, seed=5)
    first = list(ResumableBatchSampler(sampler, 2))
    assert all(isinstance(i, DrawIndex) for batch in first for i in batch)
    assert len({i.seed for batch in first for i in batch}) == 6
    assert [[i.seed for i in b] for b in ResumableBatchSampler(sampler, 2)] == [[i.seed for i in b] for b in first]
    sampler.set_epoch(1)  # another pass: other seeds
    assert not {i.seed for b in ResumableBatchSampler(sampler, 2) for i in b} & {i.seed for b in first for i in b}
    # the pipeline of an index runs from its seed, and leaves the global generators alone
    state = random.getstate()
    one, two = dataset[first[0][0]], dataset[DrawIndex(int(first[0][0]), first[0][0].seed)]
    assert one['draw'] == two['draw'] and random.getstate() == state


def test_train_cfg_of_mmengines_loops_becomes_the_resumable_one():
    assert resumable_train_cfg(dict(type='IterBasedTrainLoop', max_iters=5)) == dict(
        type='mmdet.RedetIterBasedTrainLoop', max_iters=5)
    assert resumable_train_cfg(dict(by_epoch=True, max_epochs=2)) == dict(
        type='mmdet.RedetEpochBasedTrainLoop', max_epochs=2)
    assert resumable_train_cfg(dict(type='mmengine.EpochBasedTrainLoop'))['type'] == 'mmdet.RedetEpochBasedTrainLoop'
    assert resumable_train_cfg(dict(type='OtherLoop')) == dict(type='OtherLoop')
