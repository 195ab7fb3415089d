"""Timing shared by the benchmarks and profilers: CUDA events around each call, warm-up first, L2
flushed before every timed call (a 256 MB write), median of many runs; the host's time per call of
calls back to back; per-kernel device times; wall-clock medians on the CPU; the backward through
autograd; a clear exit where there is no GPU.

The GPU time of a call is measured with the GPU kept busy (a spin kernel after the flush) while the
host enqueues it, as in a training loop where the host runs ahead: otherwise the host's own time
(torch's autograd.grad alone can take longer than the flush) shows up as idle GPU time inside the
events. The host's cost is reported apart (back_to_back_us)."""
import json
import statistics
import sys
import time

import torch

from redet_plugin.testing import deterministic_algorithms


def require_cuda(script):
    """Exits with a clear message (status 2) unless torch sees a CUDA device and redet_plugin was
    built with CUDA."""
    from redet_plugin import _ext
    if not torch.cuda.is_available():
        reason = f"torch {torch.__version__} sees no CUDA device here"
    elif not _ext.with_cuda():
        reason = f"redet_plugin._C was built without CUDA ({_ext.LOAD_ERROR or 'rebuild with FORCE_CUDA=1'})"
    else:
        return
    print(f"{script}: needs CUDA: {reason}.", file=sys.stderr)
    sys.exit(2)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def autograd_backward(output, inputs, grad):
    """The backward of `output` through autograd, as training runs it: a callable that computes
    the gradients of `inputs` (leaves with requires_grad) for `grad`, keeping the graph so that it
    can be timed again and again."""
    return lambda: torch.autograd.grad(output, inputs, grad, retain_graph=True)


def deterministic(fn):
    """fn under torch.use_deterministic_algorithms(True)."""
    def run():
        with deterministic_algorithms():
            return fn()
    return run


def speedup(row, peer_key, ours_key, name):
    """row[name] = row[peer_key] / row[ours_key] when both were measured."""
    if isinstance(row.get(peer_key), float) and isinstance(row.get(ours_key), float):
        row[name] = row[peer_key] / row[ours_key]

_flush_buffer = None


def flush_l2():
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    _flush_buffer.fill_(1.0)


# The spin, with the flush, must outlast any one call's host time here (autograd.grad included),
# and stay short: an op that waits for the GPU (a checked forward) spins through it.
QUEUE_AHEAD_CYCLES = 400_000


def time_one_call(fn, queue_ahead=True):
    """Milliseconds of one fn() call on the current CUDA stream, L2 flushed first and (unless
    queue_ahead=False: a diagnostic) the GPU kept busy while the host enqueues the call (module
    docstring)."""
    flush_l2()
    if queue_ahead:
        torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def time_cuda(fn, repeats=60, warmup=5, queue_ahead=True):
    """Median milliseconds of fn() on the current CUDA stream (time_one_call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(time_one_call(fn, queue_ahead) for _ in range(repeats))


def time_cuda_interleaved(fns, repeats=60, warmup=5, queue_ahead=True):
    """{name: median milliseconds of fn()} for a dict of calls timed in turns, one call of each
    per round (time_one_call): a drift of the GPU's state during the run then moves all of them
    alike, as a ratio between them needs."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_one_call(fn, queue_ahead))
    return {name: statistics.median(t) for name, t in times.items()}


def back_to_back_us(fn, calls=200, warmup=10):
    """Wall microseconds per fn() call over `calls` calls in a row (no flush, one synchronisation
    at the end): the host's cost per call whenever it exceeds the GPU's."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def median_wall_ms(fn, repeats, warmup=1):
    """Median wall milliseconds of fn() (for CPU code: no synchronisation)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kernel_times_us(fn, keep=lambda name: True, calls=20):
    """Device microseconds per fn() call of each kernel (torch.profiler, L2 flushed before every
    call), for the kernels whose profiler name passes `keep`; names shortened to the kernel's
    ("void redet::(anonymous namespace)::scatter_kernel<...>(...)" -> "scatter_kernel").
    The L2 flush shows as an elementwise fill kernel unless `keep` drops it. Diagnostic: the
    profiler's own timing, not CUDA events."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush_l2()
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total <= 0 or not keep(event.key):
            continue
        name = event.key.split("<")[0].split("::")[-1].replace("void ", "")[:60]
        kernels[name] = kernels.get(name, 0.0) + total / calls
    return dict(us_per_call=kernels, total_us=sum(kernels.values()))


def peak_extra_memory_mb(fn):
    """Peak memory allocated by fn() beyond what was allocated before it, in MB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def time_forward_backward(row, name, fn, x, *args):
    """fn(x, *args) as users call it: the forward with x requiring grad and the autograd backward,
    each timed (GPU ms, peak extra memory, host us per call back to back) into row[name_...].
    Returns the output and the backward (to be run again, e.g. in deterministic mode)."""
    leaf = x.detach().clone().requires_grad_(True)
    forward = lambda: fn(leaf, *args)  # noqa: E731
    out = forward()
    backward = autograd_backward(out, leaf, torch.randn_like(out))
    row[f"{name}_forward_ms"] = time_cuda(forward)
    row[f"{name}_forward_peak_extra_mb"] = peak_extra_memory_mb(forward)
    row[f"{name}_backward_ms"] = time_cuda(backward)
    row[f"{name}_backward_peak_extra_mb"] = peak_extra_memory_mb(backward)
    row[f"{name}_forward_host_us"] = back_to_back_us(forward)
    row[f"{name}_backward_host_us"] = back_to_back_us(backward)
    return out.detach(), backward


def environment():
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                cuda=torch.version.cuda)


def write_json(path, results):
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
