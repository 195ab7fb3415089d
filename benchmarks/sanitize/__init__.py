"""compute-sanitizer drivers (memcheck, racecheck): small runs of every CUDA kernel on edge
cases, as scripts (pytest does not collect them: no test_ prefix). Run from the repository root,
e.g. `compute-sanitizer --tool memcheck python -m benchmarks.sanitize.sanitize_roi_pool`;
benchmarks/device_run.sh runs them all on the GPU machine."""
