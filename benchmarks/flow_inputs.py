"""Inputs of the depth-aware flow projection, in plain torch, shared by the benchmarks, the
compute-sanitizer driver and the tests:
- benchmark_case: the benchmark's flow kinds at its shapes (FLOW_KINDS, SHAPES);
- hole_case, exact_hole_case: flows whose projection leaves large holes (HOLE_KINDS), and flows
  whose projection is exact in any summation order."""
import torch

# (batch, height, width): DAIN's training crop, 1080p and 4K.
SHAPES = {"256x448": (4, 256, 448), "1080p": (1, 1080, 1920), "4K": (1, 2160, 3840)}
# smooth: a smooth field of up to ~5% of the image size plus 1 px noise (most pixels reached);
# pan: at time t everything has moved right by half the width, plus 1 px noise: a hole band half the
#      image wide; incoherent: the smooth field plus 8 px noise per pixel: holes scattered everywhere.
FLOW_KINDS = ["smooth", "pan", "incoherent"]
HOLE_KINDS = ["half", "single", "none", "borders", "bands"]


def benchmark_case(kind, batch, height, width, t=0.5, device="cuda", seed=0):
    """flow F0->1 (B, 2, H, W) of the given kind and depth (B, 1, H, W) uniform in [1, 10]."""
    g = torch.Generator(device=device).manual_seed(seed)

    def noise(scale):
        return scale * torch.randn(batch, 2, height, width, device=device, generator=g)

    coarse = torch.randn(batch, 2, 8, 8, device=device, generator=g) * 0.05 * max(height, width)
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear",
                                             align_corners=True)
    if kind == "smooth":
        flow = smooth + noise(1.0)
    elif kind == "pan":
        flow = noise(1.0)
        flow[:, 0] += 0.5 * width / t
    elif kind == "incoherent":
        flow = smooth + noise(8.0)
    else:
        raise ValueError(f"unknown flow kind {kind!r}; expected one of {FLOW_KINDS}")
    depth = 1 + 9 * torch.rand(batch, 1, height, width, device=device, generator=g)
    return flow.contiguous(), depth


def hole_case(kind, batch, height, width, seed=0, dtype=torch.float32):
    """flow (t = 1) and depth whose projection leaves large holes of the given kind."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32),
                            torch.arange(width, dtype=torch.float32), indexing="ij")
    noise = 0.3 * torch.randn(batch, 2, height, width, generator=g)
    off = 10.0 * max(height, width) + 10  # lands outside the image
    flow = torch.zeros(batch, 2, height, width)
    if kind == "half":  # everything moves right by half the width: the left half is empty
        flow[:, 0] = width / 2
        flow = flow + noise
    elif kind == "single":  # one source pixel stays (reaching up to four targets), the rest leave
        flow[:, 0] = off
        flow[:, :, height // 3, width // 2] = 0.25
    elif kind == "none":  # every pixel leaves: all holes, nothing to fill from
        flow[:, 0] = off
    elif kind == "borders":  # contraction to the centre: holes along all four borders
        flow[:, 0] = 0.6 * ((width - 1) / 2 - xs)
        flow[:, 1] = 0.6 * ((height - 1) / 2 - ys)
        flow = flow + noise
    elif kind == "bands":  # bands of 37 columns and 23 rows leave: long runs in both directions
        leave = ((xs // 37) % 2 == 1) | ((ys // 23) % 2 == 1)
        flow[:, 0] = torch.where(leave, torch.full_like(xs, off), torch.zeros_like(xs))
        flow = flow + noise
    else:
        raise ValueError(f"unknown hole kind {kind!r}; expected one of {HOLE_KINDS}")
    depth = 0.5 + 4 * torch.rand(batch, 1, height, width, generator=g)
    return flow.to(dtype), depth.to(dtype)


def exact_hole_case(batch, height, width, seed=0, dtype=torch.float32):
    """flow (t = 1) and depth whose projection is exact in any summation order, so that CUDA
    (atomics in any order) and CPU must agree bit for bit, hole filling included: kept source pixels move by
    whole pixels (-1, 0 or 1 each way, staying inside the image), weights are powers of two, the
    others leave the image. Which pixels are kept is drawn per band of rows x band of columns with
    densities 0, 2%, 30% or 100%: empty and full columns and rows, isolated non-holes, and runs of
    holes of every length, both ways, across any segment boundary of the kernels."""
    g = torch.Generator().manual_seed(seed)

    def bands(n, longest):  # a band index per position, bands of random length 1..longest
        lengths = torch.randint(1, longest + 1, (n,), generator=g)
        return torch.repeat_interleave(torch.arange(n), lengths)[:n]

    row_band, col_band = bands(height, 300), bands(width, 50)
    levels = torch.randint(0, 4, (batch, height, width), generator=g)
    density = torch.tensor([0.0, 0.02, 0.3, 1.0])[levels]
    density = density[:, row_band][:, :, col_band]  # constant on each band x band block
    keep = torch.rand(batch, height, width, generator=g) < density
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    shift = torch.randint(-1, 2, (batch, 2, height, width), generator=g)
    shift[:, 0] = torch.minimum(torch.maximum(shift[:, 0], -xs), width - 1 - xs)  # stay inside
    shift[:, 1] = torch.minimum(torch.maximum(shift[:, 1], -ys), height - 1 - ys)
    flow = shift.float()
    flow[:, 0] = torch.where(keep, flow[:, 0], torch.full_like(flow[:, 0], 10.0 * width + 10))
    depth = 2.0 ** torch.randint(-1, 3, (batch, 1, height, width), generator=g).float()
    return flow.to(dtype), depth.to(dtype)
