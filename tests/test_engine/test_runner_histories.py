"""Through mmengine's Runner: RedetRuntimeInfoHook + RedetOptimWrapper train a toy model to the
same parameters, message hub histories and checkpointed hub state (what a resume loads) as
mmengine's RuntimeInfoHook + OptimWrapper, with a checkpoint between two log iterations."""
import uuid

import numpy as np
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

TIMES = ('train/time', 'train/data_time')  # (measured: they differ between two runs)


class _Toy(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        return dict(loss_a=(out ** 2).mean() * 20, loss_b=out.abs().mean())


def _train(work_dir, hook_type, wrapper_type):
    torch.manual_seed(0)
    data = [dict(inputs=torch.randn(2)) for _ in range(4)]
    runner = Runner(
        model=_Toy(), work_dir=str(work_dir), experiment_name=f'toy-{uuid.uuid4().hex}',
        default_scope='mmdet',
        train_dataloader=dict(dataset=data, batch_size=1, collate_fn=dict(type='pseudo_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        optim_wrapper=dict(type=wrapper_type, optimizer=dict(type='SGD', lr=0.05),
                           clip_grad=dict(max_norm=1.0)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        # 8 iterations: logs after the 3rd of each epoch; a checkpoint after iteration 5
        default_hooks=dict(runtime_info=dict(type=hook_type),
                           logger=dict(type='LoggerHook', interval=3),
                           checkpoint=dict(type='CheckpointHook', interval=5, by_epoch=False)),
        log_processor=dict(window_size=2))
    runner.train()
    saved = torch.load(work_dir / 'iter_5.pth', weights_only=False)['message_hub']
    return runner, saved


def _assert_same_histories(scalars, expected):
    assert list(scalars) == list(expected)
    for key, buffer in expected.items():
        values, counts = scalars[key].data
        assert np.array_equal(counts, buffer.data[1]), key
        if key not in TIMES:
            assert values.dtype == buffer.data[0].dtype, key
            assert np.array_equal(values, buffer.data[0]), key


def test_same_training_histories_and_checkpoint_as_mmengine(tmp_path):
    theirs, their_saved = _train(tmp_path / 'mmengine', 'RuntimeInfoHook', 'OptimWrapper')
    ours, our_saved = _train(tmp_path / 'redet', 'RedetRuntimeInfoHook', 'RedetOptimWrapper')
    assert type(ours.optim_wrapper).__module__ == 'redet_plugin.engine.optim_wrapper'
    for a, b in zip(theirs.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
    hub = ours.message_hub
    _assert_same_histories(hub.log_scalars, theirs.message_hub.log_scalars)
    assert len(hub.get_scalar('train/grad_norm').data[0]) == 8
    _assert_same_histories(our_saved['log_scalars'], their_saved['log_scalars'])
    assert len(our_saved['log_scalars']['train/loss'].data[0]) == 5  # (iterations 1-5)
    assert our_saved['resumed_keys'] == their_saved['resumed_keys']
