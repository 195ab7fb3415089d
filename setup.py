"""Builds redet_plugin._C: the C++ (CPU) kernels always, the CUDA kernels when torch sees CUDA
or FORCE_CUDA=1. Honours TORCH_CUDA_ARCH_LIST and MAX_JOBS (torch's extension tools read them)."""
import glob
import os
import re
import site
import subprocess
import sys
import warnings

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def read_version():
    """redet_plugin/version.py's __version__, read as text: setup.py runs no code of the package
    it is building (the package's __init__ loads the mm layer when mmengine is loaded)."""
    with open(os.path.join(ROOT, "redet_plugin", "version.py")) as f:
        match = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError('redet_plugin/version.py: expected a line __version__ = "X.Y.Z"')
    return match.group(1)


def import_build_torch():
    """The installed torch, which the extension must be compiled against.

    pip's build isolation (the default of `pip install -e .`) hides the environment's
    site-packages from setup.py; pyproject.toml cannot name torch (pip would download one, a CUDA
    build from PyPI, just for the build). So when torch is not importable we look in the
    site-packages of the environment pip installs into (sys.prefix: pip runs the build with that
    environment's python), appended after the isolated ones (their .pth files are not run).
    """
    try:
        import torch
        return torch
    except ImportError:
        pass
    for path in site.getsitepackages() + [site.getusersitepackages()]:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            "redet_plugin compiles against an installed torch, and none was found in "
            f"{sys.prefix}: install torch first (the CPU or CUDA build you want), then run "
            "`pip install -e .` again") from e
    print(f"redet_plugin: compiling against torch {torch.__version__} from "
          f"{os.path.dirname(os.path.dirname(torch.__file__))}", file=sys.stderr)
    return torch


def ext_modules():
    torch = import_build_torch()
    from torch.utils.cpp_extension import CppExtension, CUDAExtension, CUDA_HOME

    cpp = sorted(p for p in glob.glob("csrc/**/*.cpp", recursive=True))
    cu = sorted(glob.glob("csrc/**/cuda/*.cu", recursive=True))
    with_cuda = os.environ.get("FORCE_CUDA", "0") == "1" or (
        torch.cuda.is_available() and CUDA_HOME is not None)
    # No -std flag: torch's BuildExtension adds the C++ standard its own headers were built with
    # (mixing standards made C++ exceptions crash across the library boundary).
    cxx = ["-O3"]
    if with_cuda:
        nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr",
                "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
        return [CUDAExtension(
            "redet_plugin._C", cpp + cu, include_dirs=[os.path.join(ROOT, "csrc")],
            define_macros=[("REDET_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx, "nvcc": nvcc})]
    return [CppExtension("redet_plugin._C", cpp, include_dirs=[os.path.join(ROOT, "csrc")],
                         extra_compile_args={"cxx": cxx})]


def warn_if_libstdcxx_is_not_shared():
    """Seen on a CUDA image whose CXX is a gcc wrapper (/opt/gcc/bin/g++): the extension was linked
    without the shared libstdc++, and any C++ error message that formats a number then crashed the
    process instead of raising. /usr/bin/g++ on the same machine built a working library."""
    cxx = os.environ.get("CXX", "c++")
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return
    if not os.path.isabs(found):
        warnings.warn(f"redet_plugin: the C++ compiler {cxx!r} finds no shared libstdc++; the "
                      "built library may crash on bad input instead of raising. Build with a "
                      "system compiler, e.g. CXX=/usr/bin/g++ pip install --no-build-isolation -e .")


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension
    return BuildExtension.with_options(use_ninja=True)


def torch_requirement():
    """The torch the library was compiled against (its C++ ABI binds it to that version); an
    installed torch satisfies it, so pip never swaps (or downloads) torch for this package."""
    import torch
    return f"torch=={torch.__version__.split('+')[0]}"


# The ops layer needs torch only; the mm layer (models, datasets, metric, configs) the
# OpenMMLab stack: `pip install -e ".[mm]"`. mmcv is apart, in "mim" as mmdet has it: PyPI has
# only its source, which pip builds without the compiled ops (nms_rotated, ...) that we need, so
# it is installed first with its ops (README, "Installing by hand").
MM_REQUIRES = ["mmengine>=0.10.5,<1.0.0", "mmdet>=3.3.0,<3.4.0", "e2cnn>=0.2.3", "numpy",
               "opencv-python", "pillow", "shapely", "terminaltables", "tqdm",
               "isal"]  # ISA-L's inflate: PNGs decode about twice as fast (inference/png_bands.py)
MIM_REQUIRES = ["mmcv>=2.1.0,<2.2.0"]
TEST_REQUIRES = ["pytest>=8", "hypothesis>=6"]


warn_if_libstdcxx_is_not_shared()

setup(
    name="redet_plugin",
    version=read_version(),
    description="Rotated object detection ops (RiRoIAlignRotated, RoIPool, depth-aware flow "
                "projection) and a ReDet-like detector for the OpenMMLab stack",
    packages=find_packages(include=["redet_plugin", "redet_plugin.*"]),
    python_requires=">=3.10",
    ext_modules=ext_modules(),
    install_requires=[torch_requirement()],
    extras_require={"mm": MM_REQUIRES, "mim": MIM_REQUIRES, "tests": TEST_REQUIRES},
    cmdclass={"build_ext": build_ext_class()},
    zip_safe=False,
)
