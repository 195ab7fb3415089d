"""GPU benchmarks against the peers (ops/, detector/), profilers (profiling/) and compute-sanitizer
drivers (sanitize/); run them from the repository root as modules, e.g.
`python -m benchmarks.ops.bench_roi_pool --out roi_pool.json`. Shared timing code:
benchmarks/_timing.py. benchmarks/device_run.sh runs them on the GPU machine."""
