"""Host/GPU timeline of the flow projection at (4, 2, 256, 448), timed as the benchmark times it
(L2 flush, start event, call, end event, sync): chrome traces (chrome://tracing, Perfetto) of five
checked and five unchecked calls, and the host time per call of a few calls back to back. It showed
that the host, not the GPU, bounds the checked call at this size (README, "Speed").
Usage (repo root): python -m benchmarks.trace_depth_flow_projection --out PREFIX.json  (writes PREFIX_checked.json
and PREFIX_unchecked.json)"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._timing import back_to_back_us, require_cuda, time_one_call
from benchmarks.bench_depth_flow_projection import T
from benchmarks.flow_inputs import benchmark_case


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    prefix = args.out[:-len(".json")] if args.out.endswith(".json") else args.out
    require_cuda("trace_depth_flow_projection")
    flow, depth = benchmark_case("smooth", 4, 256, 448, T)
    op = torch.ops.redet.depth_flow_projection
    x = torch.zeros(16, device="cuda")
    for check in (True, False):
        fn = lambda: op(flow, depth, T, False, True, check)  # noqa: E731
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                time_one_call(fn)
        prof.export_chrome_trace(f"{prefix}_{'checked' if check else 'unchecked'}.json")
    for name, fn in [("add_", lambda: x.add_(1)), ("op_checked", lambda: op(flow, depth, T, False, True, True)),
                     ("op_unchecked", lambda: op(flow, depth, T, False, True, False)),
                     ("event_record", lambda: torch.cuda.Event().record())]:
        print(name, "us per call back to back:", back_to_back_us(fn), flush=True)


if __name__ == "__main__":
    main()
