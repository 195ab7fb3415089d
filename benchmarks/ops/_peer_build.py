"""Builds a peer's C++/CUDA extension from a folder of its sources with
torch.utils.cpp_extension.load, so that a benchmark can time the peer's own kernels beside ours.
Nothing here knows a particular peer: every .cpp/.cc/.cu of the folder is compiled (its headers
beside them), after a few calls that today's torch no longer accepts are replaced in a copy.
Usage (repo root): python -m benchmarks.ops._peer_build SRC_DIR --name NAME --build-dir DIR
(builds once; a later build_extension with the same arguments loads it without compiling)."""
import argparse
import os
import re
import sys
import time

SOURCES = (".cpp", ".cc", ".cu")
HEADERS = (".h", ".hpp", ".cuh")

# (pattern, replacement): old extension API that today's torch removed or rejects.
OLD_TORCH_API_FIXES = [
    (r"#include\s*[<\"]THC/THC\.h[>\"]", ""),
    (r"\bAT_CHECK\(", "TORCH_CHECK("),
    (r"\bAT_ERROR\(", "TORCH_CHECK(false, "),
    # AT_DISPATCH_*(x.type(), ...) took the deprecated type object; today it takes a ScalarType.
    (r"(AT_DISPATCH_\w+\(\s*[\w.\->]+?)\.type\(\)", r"\1.scalar_type()"),
    (r"\.data<(\w+)>\(\)", r".data_ptr<\1>()"),
]


def patched_copy(src_dir, work_dir, fixes=OLD_TORCH_API_FIXES):
    """Copies src_dir's sources and headers into work_dir with `fixes` applied (a file is
    rewritten only when its text changes, so that a rebuild can be skipped); returns
    ([source paths], {file name: number of replacements})."""
    names = [n for n in sorted(os.listdir(src_dir)) if n.endswith(SOURCES + HEADERS)]
    sources = [n for n in names if n.endswith(SOURCES)]
    if not sources:
        raise FileNotFoundError(f"no {'/'.join(SOURCES)} file in {src_dir}")
    os.makedirs(work_dir, exist_ok=True)
    changed = {}
    for name in names:
        with open(os.path.join(src_dir, name), newline="", encoding="utf-8",
                  errors="surrogateescape") as f:
            text = f.read()
        total = 0
        for pattern, replacement in fixes:
            text, count = re.subn(pattern, replacement, text)
            total += count
        if total:
            changed[name] = total
        target = os.path.join(work_dir, name)
        if os.path.exists(target):
            with open(target, newline="", encoding="utf-8", errors="surrogateescape") as f:
                if f.read() == text:
                    continue
        with open(target, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
    return [os.path.join(work_dir, n) for n in sources], changed


def build_extension(src_dir, name, build_dir, extra_include_paths=(), verbose=False):
    """Compiles (or reloads) the extension in build_dir; returns (module, info dict). Raises when
    the build fails. CUDA architectures: TORCH_CUDA_ARCH_LIST, else what torch picks."""
    from torch.utils import cpp_extension
    start = time.perf_counter()
    sources, changed = patched_copy(src_dir, os.path.join(build_dir, "src"))
    flags = ["-O3", "-w"]
    module = cpp_extension.load(
        name=name, sources=sources, build_directory=build_dir, verbose=verbose,
        extra_cflags=flags, extra_cuda_cflags=flags,
        extra_include_paths=[os.path.join(build_dir, "src"), *extra_include_paths],
        with_cuda=any(s.endswith(".cu") for s in sources))
    info = dict(source_dir=os.path.abspath(src_dir), sources=[os.path.basename(s) for s in sources],
                api_fixes_applied=changed, build_or_load_s=round(time.perf_counter() - start, 1),
                functions=sorted(n for n in dir(module) if not n.startswith("_")))
    return module, info


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src_dir")
    parser.add_argument("--name", required=True, help="the extension's module name")
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.build_dir, exist_ok=True)
    try:
        _, info = build_extension(args.src_dir, args.name, args.build_dir, verbose=True)
    except Exception as error:  # noqa: BLE001  (the caller records the reason and carries on)
        print(f"build of {args.name} from {args.src_dir} failed: {error}", file=sys.stderr)
        sys.exit(1)
    print(info)


if __name__ == "__main__":
    main()
