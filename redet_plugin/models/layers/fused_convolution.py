"""A convolution with its bias, a residual sum and the ReLU after it in one cuDNN call, for a plain
network at inference.

Once make_plain has folded a ReResNet's batch norms, its convolutions carry biases, most are
followed by a ReLU and each block's last one by the residual sum and a ReLU. PyTorch runs a cuDNN
convolution's bias as a broadcast kernel of its own, then the sum and the ReLU as more: extra
passes over every feature map. torch.cudnn_convolution_relu and torch.cudnn_convolution_add_relu
do the bias, the sum and the ReLU in the convolution's epilogue, with the same numbers up to
rounding.

The fused ops have no derivative and no lowering in torch.compile's and torch.export's graphs
(which fuse these steps their own way), so they serve only real CUDA tensors outside tracing,
without autograd; everywhere else (the CPU, training, compiling, exporting) the same computation
runs unfused.
"""
import torch
from torch import nn

__all__ = ['conv_relu', 'conv_add_relu']

_DTYPES = (torch.float16, torch.float32)  # (the ones tried on an H100)


def _fusable(conv: nn.Conv2d, x: torch.Tensor) -> bool:
    return (type(x) is torch.Tensor and x.is_cuda and x.dim() == 4
            and torch.backends.cudnn.enabled and torch.backends.cudnn.is_available()
            and conv.padding_mode == 'zeros'
            and not isinstance(conv.padding, str)
            and not (torch.is_grad_enabled() and (x.requires_grad or conv.weight.requires_grad))
            and not torch.compiler.is_compiling())


def _operands(conv: nn.Conv2d, *tensors: torch.Tensor):
    """The tensors, weight and bias in the dtype the convolution runs in (autocast's, as it casts
    a convolution's operands), or None when cuDNN's fused ops do not take that dtype."""
    dtype = (torch.get_autocast_dtype('cuda') if torch.is_autocast_enabled('cuda')
             else tensors[0].dtype)
    if dtype not in _DTYPES:
        return None
    bias = None if conv.bias is None else conv.bias.to(dtype)
    return [t.to(dtype) for t in tensors], conv.weight.to(dtype), bias


def conv_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """relu(conv(x))."""
    operands = _operands(conv, x) if _fusable(conv, x) else None
    if operands is None:
        return torch.relu_(conv(x))
    (x,), weight, bias = operands
    return torch.cudnn_convolution_relu(x, weight, bias, conv.stride, conv.padding,
                                        conv.dilation, conv.groups)


def conv_add_relu(conv: nn.Conv2d, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """relu(conv(x) + residual)."""
    operands = _operands(conv, x, residual) if _fusable(conv, x) else None
    if operands is None:
        return torch.relu_(conv(x) + residual)
    (x, residual), weight, bias = operands
    return torch.cudnn_convolution_add_relu(x, weight, residual, 1.0, bias, conv.stride,
                                            conv.padding, conv.dilation, conv.groups)
