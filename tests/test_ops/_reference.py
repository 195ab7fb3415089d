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


# ----------------------------------------------------------------------------------------------
# RiRoIAlignRotated (mmcv / ReDet spatial rules; continuous or legacy orientation interpolation)
# ----------------------------------------------------------------------------------------------
def _float32(v: float) -> float:
    """v rounded to float32: the peer's floorf/ceilf round their argument to float first."""
    return float(torch.tensor(v, dtype=torch.float32))


def _peer_bilinear(planes, y, x):
    """planes (C, H, W); y, x (P,) float64 -> (C, P). The peer's border rules: more than one pixel
    outside -> 0; within one pixel -> clamped onto the border row / column."""
    height, width = planes.shape[1:]
    inside = (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y_low, x_low = y.floor().long(), x.floor().long()
    y_at_edge, x_at_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = y_low.clamp(max=height - 1), x_low.clamp(max=width - 1)
    y = torch.where(y_at_edge, y_low.double(), y)
    x = torch.where(x_at_edge, x_low.double(), x)
    y_high = torch.where(y_at_edge, y_low, y_low + 1)
    x_high = torch.where(x_at_edge, x_low, x_low + 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    value = (hy * hx * planes[:, y_low, x_low] + hy * lx * planes[:, y_low, x_high]
             + ly * hx * planes[:, y_high, x_low] + ly * lx * planes[:, y_high, x_high])
    return value * inside


def riroi_align_rotated_reference(input, rois, output_size, spatial_scale=1.0, num_samples=0,
                                  num_orientations=8, clockwise=False, legacy_orientation=False):
    """input (N, C*nO, H, W), rois (K, 6) = (batch, cx, cy, w, h, theta). Computed in float64 one
    RoI at a time (differentiable w.r.t. input); returns float64."""
    out_h, out_w = output_size
    x = input.double()
    nO = num_orientations
    channels = x.shape[1]
    outputs = []
    for batch, cx, cy, w, h, theta in rois.double().tolist():
        cx, cy = cx * spatial_scale, cy * spatial_scale
        w, h = max(w * spatial_scale, 1.0), max(h * spatial_scale, 1.0)
        bin_h, bin_w = h / out_h, w / out_w
        grid_h = num_samples or math.ceil(_float32(h / out_h))
        grid_w = num_samples or math.ceil(_float32(w / out_w))
        angle = -theta if clockwise else theta
        cos, sin = math.cos(angle), math.sin(angle)
        # sample (ph, pw, iy, ix) at offset (yy, xx) from the centre, rotated by the angle
        ph = torch.arange(out_h, dtype=torch.float64).view(-1, 1, 1, 1)
        pw = torch.arange(out_w, dtype=torch.float64).view(1, -1, 1, 1)
        iy = torch.arange(grid_h, dtype=torch.float64).view(1, 1, -1, 1)
        ix = torch.arange(grid_w, dtype=torch.float64).view(1, 1, 1, -1)
        yy = (-h / 2 + ph * bin_h + (iy + 0.5) * bin_h / grid_h).expand(out_h, out_w, grid_h, grid_w)
        xx = (-w / 2 + pw * bin_w + (ix + 0.5) * bin_w / grid_w).expand(out_h, out_w, grid_h, grid_w)
        ys = yy * cos - xx * sin + cy
        xs = yy * sin + xx * cos + cx
        values = _peer_bilinear(x[int(batch)], ys.reshape(-1), xs.reshape(-1))
        pooled = values.view(channels, out_h, out_w, grid_h * grid_w).mean(dim=3)
        # orientation: channel c*nO + o reads (o - shift) with 1 - frac and its neighbour with frac
        a = theta * nO / (2 * math.pi)
        whole = math.floor(_float32(a))
        frac = min(max(a - whole, 0.0), 1.0)
        o = torch.arange(nO)
        main = (o - whole) % nO
        side = (o - whole + (1 if legacy_orientation else -1)) % nO
        fields = pooled.view(channels // nO, nO, out_h, out_w)
        outputs.append(((1 - frac) * fields[:, main] + frac * fields[:, side]).reshape(pooled.shape))
    if not outputs:
        return x.new_zeros(0, channels, out_h, out_w)
    return torch.stack(outputs)


# ----------------------------------------------------------------------------------------------
# Depth-aware flow projection (DAIN semantics, correct gradients)
# ----------------------------------------------------------------------------------------------
def _nearest_valid_index(valid, dim, reverse):
    """Index along `dim` of the nearest True of `valid` at or before each position (after, when
    reverse), -1 where there is none. For a hole this is its nearest non-hole strictly before."""
    n = valid.shape[dim]
    shape = [1] * valid.dim()
    shape[dim] = n
    position = torch.arange(n, device=valid.device).view(shape).expand_as(valid)
    if reverse:
        valid = valid.flip(dim)
    index = torch.where(valid, position, torch.full_like(position, -1)).cummax(dim).values
    if reverse:
        index = torch.where(index >= 0, n - 1 - index, index).flip(dim)
    return index


def _fill_holes_reference(projected, holes):
    """Each hole takes the mean of the nearest non-holes to its left, right, top and bottom (in
    that order); returns (filled, number of directions found)."""
    total = torch.zeros_like(projected)
    found = torch.zeros_like(holes, dtype=projected.dtype)
    valid = ~holes
    for dim, reverse in [(3, False), (3, True), (2, False), (2, True)]:  # left, right, top, bottom
        index = _nearest_valid_index(valid, dim, reverse)
        ok = index >= 0
        value = projected.gather(dim, index.clamp(min=0).expand_as(projected))
        total = total + torch.where(ok, value, torch.zeros_like(value))
        found = found + ok.to(projected.dtype)
    filled = torch.where(found > 0, total / found.clamp(min=1), torch.zeros_like(total))
    return torch.where(holes, filled, projected), found


class _RoundTo(torch.autograd.Function):
    """x rounded to `dtype` and back; the gradient passes unchanged (as in the op's backward)."""

    @staticmethod
    def forward(ctx, x, dtype):
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def depth_flow_projection_reference(flow, depth, t, fill_holes, inverse_depth=False):
    """Plain scatter (index_add) + normalisation + hole filling by scans, in float32 (float64 for
    float64 input); differentiable by autograd. Returns (output, count) like the op: count is the
    weight sum, or -(directions found) at a filled hole. For float16/bfloat16 the holes are filled
    from the non-holes' outputs as stored, rounded to the 16-bit dtype."""
    acc = torch.float64 if flow.dtype == torch.float64 else torch.float32
    f, d = flow.to(acc), depth.to(acc)
    batch, _, height, width = f.shape
    weight = (d if inverse_depth else 1 / d)[:, 0]
    g = f * t
    ys, xs = torch.meshgrid(torch.arange(height, dtype=acc, device=f.device),
                            torch.arange(width, dtype=acc, device=f.device), indexing="ij")
    px, py = xs + g[:, 0], ys + g[:, 1]
    inside = (px >= 0) & (px <= width - 1) & (py >= 0) & (py <= height - 1)
    left = torch.where(inside, px, torch.zeros_like(px)).detach().floor().long()
    top = torch.where(inside, py, torch.zeros_like(py)).detach().floor().long()
    right, bottom = (left + 1).clamp(max=width - 1), (top + 1).clamp(max=height - 1)
    image = torch.arange(batch, device=f.device).view(batch, 1, 1).expand_as(left)
    values = torch.stack([-weight * g[:, 0], -weight * g[:, 1], weight], dim=-1)[inside]
    sums = torch.zeros(batch * height * width, 3, dtype=acc, device=f.device)
    for x, y in [(left, top), (right, top), (left, bottom), (right, bottom)]:
        sums = sums.index_add(0, ((image * height + y) * width + x)[inside], values)
    sums = sums.view(batch, height, width, 3).permute(0, 3, 1, 2)
    count = sums[:, 2:3]
    holes = ~(count > 0)
    projected = torch.where(holes, torch.zeros_like(sums[:, :2]),
                            sums[:, :2] / torch.where(holes, torch.ones_like(count), count))
    if not fill_holes:
        return projected.to(flow.dtype), torch.where(holes, torch.zeros_like(count), count)
    if flow.dtype in (torch.float16, torch.bfloat16):
        projected = _RoundTo.apply(projected, flow.dtype)
    output, found = _fill_holes_reference(projected, holes)
    return output.to(flow.dtype), torch.where(holes, -found, count).detach()


# ----------------------------------------------------------------------------------------------
# Greedy NMS (nms_keep_mask): IoU in float64 (shapely for rotated boxes), plain greedy loop
# ----------------------------------------------------------------------------------------------
def rotated_box_polygon(box):
    """A shapely polygon of (cx, cy, w, h, theta), theta turning the w side from +x to +y."""
    from shapely.geometry import Polygon
    cx, cy, w, h, theta = (float(v) for v in box)
    c, s = math.cos(theta), math.sin(theta)
    corners = [(cx + dx * c - dy * s, cy + dx * s + dy * c)
               for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))]
    return Polygon(corners)


def rotated_iou_reference(a, b) -> float:
    """IoU in float64 by shapely; 0 for a box of area < 1e-14, as the op."""
    if float(a[2]) * float(a[3]) < 1e-14 or float(b[2]) * float(b[3]) < 1e-14:
        return 0.0
    pa, pb = rotated_box_polygon(a), rotated_box_polygon(b)
    inter = pa.intersection(pb).area
    return inter / (pa.area + pb.area - inter)


def horizontal_iou_reference(a, b) -> float:
    """mmcv's nms IoU (offset 0) in float64."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def greedy_nms_reference(boxes, scores, iou_threshold, labels=None):
    """keep (N,) bool: visit by score (highest first, equal scores by index); a kept box suppresses
    the later boxes of its label with IoU > iou_threshold."""
    iou = rotated_iou_reference if boxes.shape[1] == 5 else horizontal_iou_reference
    n = boxes.shape[0]
    order = sorted(range(n), key=lambda i: (-float(scores[i]), i))
    label = [0] * n if labels is None else labels.tolist()
    box = boxes.double().tolist()
    keep = [False] * n
    removed = [False] * n
    for r, i in enumerate(order):
        if removed[i]:
            continue
        keep[i] = True
        for j in order[r + 1:]:
            if not removed[j] and label[j] == label[i] and iou(box[i], box[j]) > iou_threshold:
                removed[j] = True
    return torch.tensor(keep, dtype=torch.bool)
