"""mmengine checkpoints (HistoryBuffer, numpy objects inside) load under torch >= 2.6's
weights-only torch.load once redet_plugin is imported: resume and load_from both work."""
import copy
import subprocess
import sys

import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

import redet_plugin.mm  # noqa: F401  (registers the mm layer)


class ToyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, targets, mode="tensor"):
        out = self.linear(torch.stack(inputs))
        if mode == "loss":
            return dict(loss=((out.squeeze(1) - torch.stack(targets)) ** 2).mean())
        return out


class ToyData(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.tensor([float(i), 1.0])
        return dict(inputs=x, targets=x.sum())


def make_runner(work_dir, max_epochs, **kwargs):
    return Runner(
        model=ToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type="DefaultSampler", shuffle=False),
                              batch_size=4, num_workers=0),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1),
                           logger=dict(type="LoggerHook", interval=1)),
        env_cfg=dict(dist_cfg=dict(backend="gloo")),
        default_scope="mmengine", **kwargs)


def test_checkpoint_with_mmengine_objects_loads_weights_only(tmp_path):
    make_runner(tmp_path, 1).train()
    ckpt = tmp_path / "epoch_1.pth"
    state = torch.load(ckpt, map_location="cpu")  # weights_only=True by default on torch >= 2.6
    assert "message_hub" in state and "HistoryBuffer" in repr(type(
        next(iter(state["message_hub"]["log_scalars"].values()))))
    # Without the plugin's registration the same load is refused: the registration is what works.
    plain = subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(ckpt)!r})"],
                           capture_output=True, text=True)
    assert plain.returncode != 0 and "Weights only load failed" in plain.stderr


def test_resume_continues_from_saved_epoch(tmp_path):
    first = make_runner(tmp_path, 2)
    first.train()
    weights_after_two = copy.deepcopy(first.model.state_dict())
    resumed = make_runner(tmp_path, 3, resume=True)
    resumed.train()
    assert resumed.train_loop.epoch == 3 and resumed.iter == 6
    # The resumed run started from epoch 2's weights, so epoch 3 changed them further.
    assert not torch.equal(resumed.model.state_dict()["linear.weight"],
                           weights_after_two["linear.weight"])
    history = resumed.message_hub.get_scalar("train/loss")
    assert len(history.data[0]) == 6  # the log history of the first two epochs came back too


def test_load_from_checkpoint(tmp_path):
    first = make_runner(tmp_path / "a", 1)
    first.train()
    loaded = make_runner(tmp_path / "b", 1, load_from=str(tmp_path / "a" / "epoch_1.pth"))
    loaded.load_or_resume()
    torch.testing.assert_close(loaded.model.state_dict()["linear.weight"],
                               first.model.state_dict()["linear.weight"])
