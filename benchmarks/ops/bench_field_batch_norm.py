"""FieldBatchNorm vs e2cnn's InnerBatchNorm (cuDNN BatchNorm3d) on one GPU, at the ReResNet-50
shapes of a batch of 2 images of 1024^2 (8-rotation regular fields): training forward + backward
through autograd (input, weight and bias gradients), training forward, eval forward, and eval
forward + backward (norm_eval), fp32 and under fp16 autocast, on NCHW maps and on channels-last
maps (what the norms of a model with channels_last=True get; e2cnn's view of them is a copy).
`ours_*` is the module as configured; `field_norm_*` forces field_batch_norm on every map (on
CUDA torch's SyncBatchNorm kernels), and `reductions_*` forces its portable path (torch reductions
and elementwise ops) instead of those kernels.
Diagnostic: no goal.
Usage (repo root): python -m benchmarks.ops.bench_field_batch_norm --out field_batch_norm_h200.json"""
import argparse
import contextlib
import itertools

import torch
from e2cnn import nn as enn

from benchmarks._timing import environment, require_cuda, time_cuda, write_json
from redet_plugin.models.layers.equivariant import regular_type
from redet_plugin.models.layers import field_batch_norm as field_batch_norm_module
from redet_plugin.models.layers.field_batch_norm import FieldBatchNorm

SHAPES = [(2, 64, 512, 512), (2, 64, 256, 256), (2, 256, 256, 256), (2, 128, 128, 128),
          (2, 512, 128, 128), (2, 1024, 64, 64), (2, 2048, 32, 32)]


@contextlib.contextmanager
def forced(uses_field_norm=True, sync_kernels=True):
    rule = FieldBatchNorm.uses_field_norm
    serve = field_batch_norm_module._sync_batch_norm_kernels_serve
    FieldBatchNorm.uses_field_norm = lambda self, x: uses_field_norm
    if not sync_kernels:
        field_batch_norm_module._sync_batch_norm_kernels_serve = lambda x, bn: False
    try:
        yield
    finally:
        FieldBatchNorm.uses_field_norm = rule
        field_batch_norm_module._sync_batch_norm_kernels_serve = serve


def timings(module, x, amp):
    """ms of training forward + backward, training forward, eval forward, eval forward + backward."""
    field_type = module.in_type
    params = tuple(module.parameters())
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=amp)

    def forward():
        with autocast:
            return module(enn.GeometricTensor(x, field_type)).tensor

    module.train()
    grad = torch.randn_like(forward())

    def forward_backward():
        torch.autograd.grad(forward(), (x,) + params, grad)

    row = dict(train_fwd_bwd_ms=time_cuda(forward_backward), train_fwd_ms=time_cuda(forward))
    module.eval()  # eval_fwd_bwd: running statistics with gradients, as under norm_eval
    row.update(eval_fwd_ms=time_cuda(forward), eval_fwd_bwd_ms=time_cuda(forward_backward))
    module.train()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    require_cuda("bench_field_batch_norm")
    rows = []
    for layout, amp, shape in itertools.product(("nchw", "channels_last"), (False, True), SHAPES):
        field_type = regular_type(shape[1])
        # under autocast the input is what a convolution gives: fp16
        x = torch.randn(shape, device="cuda", dtype=torch.float16 if amp else torch.float32)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_()
        row = dict(shape=list(shape), amp=amp, layout=layout)
        e2cnn = enn.InnerBatchNorm(field_type).cuda()
        ours = FieldBatchNorm(field_type).cuda()
        row["ours_uses_field_norm"] = ours.uses_field_norm(x)
        for name, module in (("e2cnn", e2cnn), ("ours", ours)):
            row.update({f"{name}_{k}": v for k, v in timings(module, x, amp).items()})
        with forced():
            row.update({f"field_norm_{k}": v for k, v in timings(ours, x, amp).items()})
        with forced(sync_kernels=False):
            row.update({f"reductions_{k}": v for k, v in timings(ours, x, amp).items()})
        print(row, flush=True)
        rows.append(row)
    write_json(args.out, dict(what=__doc__.splitlines()[0], environment=environment(),
                              command="python -m benchmarks.ops.bench_field_batch_norm --out "
                              + args.out,
                              results=rows))


if __name__ == "__main__":
    main()
