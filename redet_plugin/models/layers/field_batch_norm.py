"""FieldBatchNorm: e2cnn's InnerBatchNorm computed per channel and then per field.

InnerBatchNorm gives each field (e.g. a regular field: 8 orientation channels) one mean and variance
over the batch, the field's channels and space. It views (B, C, H, W) as (B, C / s, s, H, W) and
calls BatchNorm3d, whose per-channel GPU kernels then run about one block per field (8 fields at
64 channels), and whose view of a channels-last tensor is a copy. Here the statistics are
per-channel (over every dim but the channel one) and then combined per field, which reads any
memory format as it is; the normalisation is one elementwise pass with the field's statistics
copied to each of its channels, in the input's memory format; the training backward is batch
norm's own (two per-field sums, then one formula for the input gradient) rather than autograd
through the statistics.

On CUDA the passes are torch's SyncBatchNorm kernels (_SyncBatchNormKernels): one kernel each
for the per-channel statistics (for 16-bit channels-last maps, cuDNN's: _channel_stats), their
per-field combination, the normalisation, the backward sums and the input gradient. Elsewhere
(and for parameters in another dtype than the statistics) they are torch reductions and
elementwise ops (_BatchStatisticsNorm).

FieldBatchNorm is an InnerBatchNorm: same constructor, submodules, parameters and buffers (its
BatchNorm3d `batch_norm_[s]` hold them and their settings: momentum, eps, track_running_stats,
training), so checkpoints load either way, export() is e2cnn's, and code that looks for _BatchNorm
(norm_eval, frozen stages, zero-init) finds and switches them as before. Inner modules that are
not plain BatchNorm3d (e.g. after SyncBatchNorm conversion) are called as e2cnn calls them, on the
(B, fields, s, H, W) view.

Low-precision inputs (fp16/bf16, e.g. under autocast): statistics and sums in float32, output and
input gradient in the input's dtype, as torch's batch norm does.
"""
import contextlib

import torch
from e2cnn import nn as enn
from e2cnn.nn.modules.batchnormalization import inner as e2cnn_inner
from e2cnn.nn.modules.utils import check_consecutive_numbers

from redet_plugin.models.utils.autocast_off import autocast_off
from redet_plugin.models.utils.device_constants import full

__all__ = ["FieldBatchNorm", "field_batch_norm"]


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _Fields:
    """How (B, C, *spatial) channels group into fields of `size` consecutive channels.

    Statistics are reduced per channel, over every dim but the channel one, and then summed per
    field: the reductions read the tensor in whatever memory format it has (channels-last
    included), where a (B, fields, size * H * W) view would need a contiguous copy."""

    def __init__(self, x: torch.Tensor, size: int):
        self.size, self.count = size, x.shape[1] // size
        self.dims = (0,) + tuple(range(2, x.dim()))
        self.elements = x.numel() // self.count  # per field: batch x size x spatial
        self._broadcast = (x.shape[1],) + (1,) * (x.dim() - 2)

    def sum(self, per_channel: torch.Tensor) -> torch.Tensor:
        return per_channel.view(self.count, self.size).sum(1)

    def channel_sums(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.sum(x.sum(self.dims, dtype=dtype))

    def per_channel(self, v: torch.Tensor) -> torch.Tensor:
        """(fields,) -> every channel of a field gets its field's value, shaped to broadcast
        against (B, C, *spatial)."""
        return self.per_channel_flat(v).view(self._broadcast)

    def per_channel_flat(self, v: torch.Tensor) -> torch.Tensor:
        """(..., fields) -> (..., C): every channel of a field gets its field's value (one copy
        for all leading rows)."""
        return v[..., None].expand(*v.shape, self.size).reshape(*v.shape[:-1], -1)


def _mean_var(x: torch.Tensor, fields: _Fields):
    """Per-field mean and biased variance, in float32 at least."""
    if x.dtype == _stats_dtype(x.dtype):
        # per-channel Welford statistics, combined exactly (every channel has as many elements)
        var, mean = torch.var_mean(x, dim=fields.dims, correction=0)
        spread, field_mean = torch.var_mean(mean.view(fields.count, fields.size), dim=1,
                                            correction=0)
        return field_mean, var.view(fields.count, fields.size).mean(1) + spread
    # fp16/bf16: var_mean would round its results to the input's dtype; a sum and a sum of
    # squares accumulated in float32 read the input once each, without a float32 copy of it
    n = fields.elements
    mean = fields.channel_sums(x, torch.float32) / n
    squares = torch.linalg.vector_norm(x, 2, fields.dims, dtype=torch.float32).square()
    return mean, (fields.sum(squares) / n - mean.square()).clamp_min(0)


def _scale_shift(x: torch.Tensor, fields: _Fields, scale: torch.Tensor, shift: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """x * scale + shift (per field) in one pass, computed in the dtype of scale and shift and
    written in `dtype`, in x's memory format."""
    out = torch.empty_like(x, dtype=dtype)
    return torch.addcmul(fields.per_channel(shift), x, fields.per_channel(scale), out=out)


def _product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a * b computed and written in `dtype` in one pass (a * b of fp16 tensors would be rounded,
    and may overflow, in fp16)."""
    zero = torch.zeros((1,) * a.dim(), dtype=dtype, device=a.device)
    return torch.addcmul(zero, a, b)


def _check_first_order():
    # grad mode is on in a backward only for create_graph=True; without a double backward the
    # second-order terms would be silently missing
    if torch.is_grad_enabled():
        raise RuntimeError("FieldBatchNorm has no double backward (create_graph=True)")


def _sum_g_xhat(grad, x, fields, mean, invstd, sum_g):
    """Per field: the sum of grad * x_hat, x_hat = (x - mean) * invstd, from the sum of grad * x."""
    sum_gx = fields.channel_sums(_product(grad, x, mean.dtype), mean.dtype)
    return (sum_gx - mean * sum_g) * invstd


class _BatchStatisticsNorm(torch.autograd.Function):
    """Batch norm of (B, C, *spatial) with the batch's statistics per field of `field_size`
    channels. Also returns the mean and the biased variance (not differentiable) for the running
    averages."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, field_size):
        fields = _Fields(x, field_size)
        # the elementwise ops below mix dtypes on purpose; autocast would cast whole tensors first
        with autocast_off(x.device.type):
            mean, var = _mean_var(x, fields)
            invstd = torch.sqrt(var + eps).reciprocal()
            scale = invstd if weight is None else invstd * weight
            shift = -mean * scale if bias is None else bias - mean * scale
            out = _scale_shift(x, fields, scale, shift, x.dtype)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.fields, ctx.bias_dtype = fields, None if bias is None else bias.dtype
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx, grad, _grad_mean, _grad_var):
        _check_first_order()
        x, weight, mean, invstd = ctx.saved_tensors
        fields = ctx.fields
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        with autocast_off(grad.device.type):
            sum_g = fields.channel_sums(grad, mean.dtype)
            if need_x or need_weight:
                sum_g_xhat = _sum_g_xhat(grad, x, fields, mean, invstd, sum_g)
            if need_x:
                # dx = a * (g - sum_g / n - x_hat * sum_g_xhat / n) with a = weight * invstd,
                # written as a * g + c * x + d
                n = fields.elements
                a = invstd if weight is None else invstd * weight
                c = -a * invstd * sum_g_xhat / n
                d = -a * sum_g / n - c * mean
                cx_d = torch.addcmul(fields.per_channel(d), x, fields.per_channel(c))
                out = cx_d if cx_d.dtype == x.dtype else torch.empty_like(cx_d, dtype=x.dtype)
                grad_x = torch.addcmul(cx_d, grad, fields.per_channel(a), out=out)
            if need_weight:
                grad_weight = sum_g_xhat.to(weight.dtype)
            if need_bias:
                grad_bias = sum_g.to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None


class _SyncBatchNormKernels(torch.autograd.Function):
    """CUDA: the same batch norm as _BatchStatisticsNorm, by torch's SyncBatchNorm kernels (one
    pass each for the per-channel statistics, the normalisation, the backward sums and the input
    gradient, in either memory format, fp16/bf16 with float32 statistics). The field's channels
    play the part of SyncBatchNorm's processes: their per-channel statistics are combined per field
    by the kernel that combines the processes' (and that also updates the running averages), and
    the other kernels get per-channel copies of the field's statistics and sums."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, field_size, running_mean, running_var, momentum):
        fields = _Fields(x, field_size)
        channel_mean, channel_invstd = _channel_stats(x, eps)
        # (field size, fields): each field channel as one "process" of the combining kernel,
        # whose counts have the running statistics' dtype (else the input's)
        counts = full(field_size, fields.elements // field_size, (
            channel_mean.dtype if running_mean is None else running_mean.dtype), x.device)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            channel_mean, _by_process(channel_mean, fields), _by_process(channel_invstd, fields),
            running_mean, running_var, momentum, eps, counts)
        # the per-channel copies of the field values in one pass (the kernels below take (C,)
        # tensors); weight and bias have the statistics' dtype (_sync_batch_norm_kernels_serve)
        affine = [p for p in (weight, bias) if p is not None]
        mean_c, invstd_c, *affine_c = fields.per_channel_flat(torch.stack([mean, invstd, *affine]))
        weight_c = affine_c.pop(0) if weight is not None else None
        bias_c = affine_c.pop(0) if bias is not None else None
        out = torch.batch_norm_elemt(x, weight_c, bias_c, mean_c, invstd_c, eps)
        ctx.save_for_backward(x, weight_c, mean_c, invstd_c, invstd)
        ctx.fields, ctx.bias_dtype = fields, None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        _check_first_order()
        x, weight_c, mean_c, invstd_c, invstd = ctx.saved_tensors
        fields = ctx.fields
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        grad = grad.contiguous(memory_format=_memory_format(x))
        # per channel: sum of grad and of grad * (x - field mean); summed per field, both at once
        sums_c = torch.batch_norm_backward_reduce(grad, x, mean_c, invstd_c, weight_c, True, False,
                                                  False)[:2]
        sums = torch.stack(sums_c).view(2, fields.count, fields.size).sum(2)
        sum_g, sum_g_xmu = sums
        if need_x:
            count = full(1, fields.elements, torch.int32, x.device)
            sum_g_c, sum_g_xmu_c = fields.per_channel_flat(sums)
            grad_x = torch.batch_norm_backward_elemt(grad, x, mean_c, invstd_c, weight_c, sum_g_c,
                                                     sum_g_xmu_c, count)
        if need_weight:
            grad_weight = (sum_g_xmu * invstd).to(weight_c.dtype)
        if need_bias:
            grad_bias = sum_g.to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


def _channel_stats(x: torch.Tensor, eps: float):
    """Per-channel mean and 1 / sqrt(biased variance + eps) of x, float32 for fp16/bf16 x:
    torch.batch_norm_stats, or for 16-bit channels-last maps cuDNN's training batch norm (its
    normalised output is dropped). batch_norm_stats' channels-last Welford kernel is bound by its
    arithmetic, not by memory: it takes as long on a 16-bit map as on a float32 one."""
    if (x.element_size() == 2 and eps >= _CUDNN_MIN_EPS and _is_channels_last(x)
            and torch.backends.cudnn.is_acceptable(x)):
        channels = x.shape[1]
        ones = full(channels, 1.0, torch.float32, x.device)
        zeros = full(channels, 0.0, torch.float32, x.device)
        _, mean, invstd, _ = torch.cudnn_batch_norm(x, ones, zeros, None, None, True, 0.0, eps)
        return mean, invstd
    return torch.batch_norm_stats(x, eps)


_CUDNN_MIN_EPS = 1e-5  # CUDNN_BN_MIN_EPSILON: cuDNN refuses a smaller eps


def _by_process(per_channel: torch.Tensor, fields: _Fields) -> torch.Tensor:
    """(C,) -> (field size, fields): row j holds channel j of every field. A strided view: the
    combining kernel reads it through its strides."""
    return per_channel.view(fields.count, fields.size).t()


def _memory_format(x: torch.Tensor):
    return torch.channels_last if _is_channels_last(x) else torch.contiguous_format


class _FieldScaleShift(torch.autograd.Function):
    """x * scale + shift per field of `field_size` channels (the running-statistics
    normalisation), in one pass."""

    @staticmethod
    def forward(ctx, x, scale, shift, field_size):
        fields = _Fields(x, field_size)
        with autocast_off(x.device.type):
            out = _scale_shift(x, fields, scale, shift, x.dtype)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, scale)
        ctx.fields, ctx.x_dtype = fields, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        _check_first_order()
        x, scale = ctx.saved_tensors
        fields = ctx.fields
        need_x, need_scale, need_shift = ctx.needs_input_grad[:3]
        grad_x = grad_scale = grad_shift = None
        with autocast_off(grad.device.type):
            if need_x:
                out = torch.empty_like(grad, dtype=ctx.x_dtype)
                grad_x = torch.mul(grad, fields.per_channel(scale), out=out)
            if need_scale:
                grad_scale = fields.channel_sums(_product(grad, x, scale.dtype), scale.dtype)
            if need_shift:
                grad_shift = fields.channel_sums(grad, scale.dtype)
        return grad_x, grad_scale, grad_shift, None


def field_batch_norm(x: torch.Tensor, bn: torch.nn.modules.batchnorm._BatchNorm,
                     field_size: int) -> torch.Tensor:
    """Batch norm of `x` (B, C, *spatial), C = bn.num_features * field_size, any memory format:
    statistics per field of `field_size` consecutive channels, over the batch, the field's
    channels and space, with the parameters, buffers and settings of `bn` (a batch norm over
    the fields) exactly as bn's own forward uses and updates them (momentum, cumulative average
    when momentum is None, num_batches_tracked, unbiased variance in the running average, eval
    mode, and batch statistics in eval mode when there are no running statistics)."""
    channels = bn.num_features * field_size
    if x.dim() < 3 or x.shape[1] != channels:
        raise ValueError(f"field_batch_norm: x must be a (B, {channels}, ...) tensor "
                         f"({bn.num_features} fields of {field_size} channels); "
                         f"got {tuple(x.shape)}")
    momentum = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            momentum = 1.0 / float(bn.num_batches_tracked)
    use_batch_stats = bn.training or (bn.running_mean is None and bn.running_var is None)

    if not use_batch_stats:
        invstd = torch.sqrt(bn.running_var.to(_stats_dtype(x.dtype)) + bn.eps).reciprocal()
        scale = invstd if bn.weight is None else invstd * bn.weight
        shift = -bn.running_mean * scale if bn.bias is None else bn.bias - bn.running_mean * scale
        return _FieldScaleShift.apply(x, scale, shift, field_size)

    n = x.numel() // bn.num_features
    if n <= 1:
        raise ValueError("field_batch_norm: expected more than 1 value per field when training; "
                         f"got x of size {tuple(x.shape)}")
    updates_running = bn.training and bn.track_running_stats and bn.running_mean is not None
    if _sync_batch_norm_kernels_serve(x, bn):
        running_mean, running_var = ((bn.running_mean, bn.running_var) if updates_running
                                     else (None, None))
        return _SyncBatchNormKernels.apply(x, bn.weight, bn.bias, bn.eps, field_size,
                                           running_mean, running_var, momentum)
    out, mean, var = _BatchStatisticsNorm.apply(x, bn.weight, bn.bias, bn.eps, field_size)
    if updates_running:
        with torch.no_grad():
            running_mean, running_var = bn.running_mean, bn.running_var
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            unbiased = var * (n / (n - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return out


def _indexes_by_label(in_type, labels):
    """e2cnn's indexes_from_labels (the same dict), in one pass: e2cnn's checks the channels of
    a label once per field of that label, quadratic in the fields (half of the R50 model's build
    time goes there)."""
    indices, fields = {}, {}
    position = 0
    for field, (label, representation) in enumerate(zip(labels, in_type.representations)):
        indices.setdefault(label, []).extend(range(position, position + representation.size))
        fields.setdefault(label, []).append(field)
        position += representation.size
    return {label: (check_consecutive_numbers(indices[label]), fields[label], indices[label])
            for label in indices}


@contextlib.contextmanager
def _one_pass_grouping():
    """e2cnn's InnerBatchNorm constructor groups its fields with _indexes_by_label."""
    original = e2cnn_inner.indexes_from_labels
    e2cnn_inner.indexes_from_labels = _indexes_by_label
    try:
        yield
    finally:
        e2cnn_inner.indexes_from_labels = original


class FieldBatchNorm(enn.InnerBatchNorm):
    """e2cnn's InnerBatchNorm (same arguments, state_dict and results), faster on a GPU.

    Args: as enn.InnerBatchNorm: in_type (fields whose representations allow pointwise
    non-linearities, e.g. regular fields), eps, momentum, affine, track_running_stats.

    On CUDA the field norm always runs: with batch statistics torch's SyncBatchNorm kernels (in
    training, against cuDNN's BatchNorm3d on e2cnn's view at the ReResNet-50's shapes: 3.5-16x
    faster on the large maps up to 256^2, 0.7-1.2x on the last two stages' small ones, where
    both take well under a millisecond; benchmarks/ops/bench_field_batch_norm.py), with running
    statistics (eval mode, also norm_eval) one scale-shift pass. Channels-last maps take it on
    any device: e2cnn's (B, fields, s, H, W) view would copy them to NCHW. On the CPU NCHW maps
    go to torch's own batch norm on e2cnn's view. Unlike e2cnn's forward, which slices with the
    elements of a device buffer, no path reads a value back from the device: on a GPU the host
    never waits here.
    """

    def __init__(self, *args, **kwargs):
        with _one_pass_grouping():
            super().__init__(*args, **kwargs)
        # the channels of each field size as a Python slice where they are contiguous (else
        # e2cnn's index buffer is used): e2cnn's own forward slices with its buffer's elements,
        # which reads them back from the GPU, 4 host synchronisations per call
        self._channels = {}
        for s, contiguous in self._contiguous.items():
            indices = getattr(self, f"indices_{s}").tolist()
            self._channels[s] = slice(indices[0], indices[1]) if contiguous else None

    def forward(self, input: enn.GeometricTensor) -> enn.GeometricTensor:
        if not isinstance(input, enn.GeometricTensor) or input.type != self.in_type:
            got = input.type if isinstance(input, enn.GeometricTensor) else type(input).__name__
            raise TypeError(f"{type(self).__name__}: input must be a GeometricTensor of type "
                            f"{self.in_type}; got {got}")
        norms = self._norms()
        x = input.tensor
        b, _, h, w = x.shape
        # (a norm replaced by another kind, e.g. SyncBatchNorm, is called as e2cnn calls it)
        if (all(type(bn) is torch.nn.BatchNorm3d for bn in norms.values())
                and self.uses_field_norm(x)):
            def normalise(part, s, bn):
                return field_batch_norm(part, bn, s)
        else:  # e2cnn's computation: the norm over (B, fields, s, H, W)
            def normalise(part, s, bn):
                return bn(part.reshape(b, -1, s, h, w)).view(part.shape)
        if len(norms) == 1:  # one field size, e.g. regular fields: all channels at once
            (s, bn), = norms.items()
            out = normalise(x, s, bn)
        else:
            out = torch.empty_like(x)
            for s, bn in norms.items():
                channels = self._channels[s]
                if channels is None:
                    channels = getattr(self, f"indices_{s}")
                part = x[:, channels]
                out[:, channels] = normalise(part, s, bn)
        return enn.GeometricTensor(out, self.out_type)

    def uses_field_norm(self, x: torch.Tensor) -> bool:
        """Whether forward(x) takes field_batch_norm (class docstring) or e2cnn's path."""
        return x.is_cuda or _is_channels_last(x)

    def _norms(self) -> dict:
        return {s: getattr(self, f"batch_norm_[{s}]") for s in self._channels}


def _sync_batch_norm_kernels_serve(x: torch.Tensor, bn) -> bool:
    """torch's SyncBatchNorm kernels exist for CUDA only. They take parameters and running
    statistics in the statistics' dtype (float32 for fp16/bf16 input): with e.g. bf16 running
    statistics their per-channel counts would be rounded to bf16. The input gradient's kernel
    takes a field's element count as an int32."""
    stats_dtype = _stats_dtype(x.dtype)
    return (x.is_cuda and x.numel() // bn.num_features < 2**31
            and all(t is None or t.dtype == stats_dtype
                    for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var)))


def _is_channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
