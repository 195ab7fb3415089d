"""'RedetDistributedDataParallel': mmengine's DDP wrapper whose training step the model's
`cuda_graph_step` may capture whole, gradient all-reduce included.

mmengine's MMDistributedDataParallel.train_step calls the model's forward through DDP, so a
model's own train_step, and with it a captured step, never runs under it. This wrapper hands the
step to the model (CudaGraphDetectorMixin.graph_train_step) where the model captures its steps:
the steps it cannot capture (warm-up, layouts the processes do not share) run through DDP as
before, and the captured ones average the gradients inside the graph
(redet_plugin/cuda_graphs/distributed_step.py). Without cuda_graph_step, or where a captured
step cannot run in these processes (below, one line in the log), it is MMDistributedDataParallel.

In a config (the plugin's configs set it):
model_wrapper_cfg = dict(type='RedetDistributedDataParallel', broadcast_buffers=False,
                         find_unused_parameters=False)
"""
import torch.distributed as dist
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from ..cuda_graphs.distributed_step import DistributedStep
from ..utils.registration import register

__all__ = ["DistributedDataParallel"]


@register(MODEL_WRAPPERS)  # (mmengine's: its Runner looks the wrapper type up there)
class DistributedDataParallel(MMDistributedDataParallel):
    """MMDistributedDataParallel (same arguments) that lets the model capture its training
    step, gradient all-reduce included."""

    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self.distributed_step = None
        graphs = getattr(module, "step_graphs", None)
        if graphs is None:
            return
        # the same in every process (the config, the launcher): all make the gloo group or none
        reason = self._no_capture_reason()
        if reason is not None:
            graphs.say_eager(reason, on_cuda=bool(self.device_ids))
            # (a step the model captured here would not average the gradients)
            module.step_graphs = None
            return
        self.distributed_step = DistributedStep(self.process_group)

    def _no_capture_reason(self):
        if not self.device_ids:
            return "the model is not on a CUDA device"
        backend = str(dist.get_backend(self.process_group))  # (e.g. 'nccl', 'cpu:gloo,cuda:nccl')
        if "nccl" not in backend:
            return f"the {backend} backend (only NCCL collectives can be captured)"
        if self.broadcast_buffers:
            return ("broadcast_buffers=True (DDP broadcasts the buffers in its forward, which "
                    "a captured step does not run)")
        if self.detect_anomalous_params:
            return "detect_anomalous_params=True (it walks the autograd graph on the host)"
        return None

    def train_step(self, data, optim_wrapper) -> dict:
        if self.distributed_step is None:
            return super().train_step(data, optim_wrapper)
        return self.module.graph_train_step(data, optim_wrapper, wrapper=self,
                                            distributed=self.distributed_step)
