"""GPU benchmarks against the peers and compute-sanitizer drivers; run them from the repository
root as modules, e.g. `python -m benchmarks.bench_roi_pool --out roi_pool.json`."""
