"""Plain reference implementations of the ops, written for clarity, not speed.
Each op's section is self-contained; the tests compare the compiled kernels against these."""
import math

import torch


# ----------------------------------------------------------------------------------------------
# RoIPool (torchvision semantics)
# ----------------------------------------------------------------------------------------------
def _round_half_away(v: float) -> int:
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


def roi_pool_reference(input, rois, output_size, spatial_scale):
    """Returns (output, argmax) for input (N, C, H, W) and rois (K, 5). Bin sizes are computed in
    the input's dtype, as torchvision does, so float16 bins agree too."""
    ph_out, pw_out = output_size
    num_rois, channels = rois.shape[0], input.shape[1]
    height, width = input.shape[2:]
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    output = torch.zeros(num_rois, channels, ph_out, pw_out, dtype=input.dtype)
    argmax = torch.full((num_rois, channels, ph_out, pw_out), -1, dtype=torch.int32)
    x = input.detach().cpu()
    for k in range(num_rois):
        r = rois[k].detach().cpu().to(acc)
        n = int(r[0])
        x1, y1, x2, y2 = (_round_half_away(float(v * torch.tensor(spatial_scale, dtype=acc)))
                          for v in r[1:])
        roi_w, roi_h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
        bin_h = torch.tensor(roi_h, dtype=input.dtype) / torch.tensor(ph_out, dtype=input.dtype)
        bin_w = torch.tensor(roi_w, dtype=input.dtype) / torch.tensor(pw_out, dtype=input.dtype)
        for ph in range(ph_out):
            for pw in range(pw_out):
                hs = math.floor(float(torch.tensor(ph, dtype=input.dtype) * bin_h))
                he = math.ceil(float(torch.tensor(ph + 1, dtype=input.dtype) * bin_h))
                ws = math.floor(float(torch.tensor(pw, dtype=input.dtype) * bin_w))
                we = math.ceil(float(torch.tensor(pw + 1, dtype=input.dtype) * bin_w))
                hs, he = min(max(hs + y1, 0), height), min(max(he + y1, 0), height)
                ws, we = min(max(ws + x1, 0), width), min(max(we + x1, 0), width)
                if he <= hs or we <= ws:
                    continue
                window = x[n, :, hs:he, ws:we].reshape(channels, -1)
                values, flat = window.max(dim=1)  # first max on ties, like the kernel's `>` scan
                rows, cols = flat // (we - ws) + hs, flat % (we - ws) + ws
                output[k, :, ph, pw] = values
                argmax[k, :, ph, pw] = (rows * width + cols).to(torch.int32)
    return output, argmax


def roi_pool_backward_reference(grad_output, rois, argmax, input_shape):
    """Scatters each output gradient onto the input pixel its argmax names (none when -1)."""
    grad_input = torch.zeros(input_shape, dtype=torch.float64)
    height, width = input_shape[2:]
    for k in range(rois.shape[0]):
        n = int(rois[k, 0])
        a = argmax[k].reshape(input_shape[1], -1).long()
        g = grad_output[k].reshape(input_shape[1], -1).double()
        plane = grad_input[n].reshape(input_shape[1], height * width)
        keep = a >= 0
        for c in range(input_shape[1]):
            plane[c].index_add_(0, a[c][keep[c]], g[c][keep[c]])
    return grad_input
