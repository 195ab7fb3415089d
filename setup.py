"""Builds redet_plugin._C: the C++ (CPU) kernels always, the CUDA kernels when torch sees CUDA
or FORCE_CUDA=1. Honours TORCH_CUDA_ARCH_LIST and MAX_JOBS (torch's extension tools read them)."""
import glob
import os

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def ext_modules():
    try:
        import torch
    except ImportError as e:  # pip's isolated build env has no torch
        raise RuntimeError(
            "redet_plugin compiles against the torch you have installed: install torch first, "
            "then build with `pip install --no-build-isolation -e .`") from e
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


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension
    return BuildExtension.with_options(use_ninja=True)


setup(
    name="redet_plugin",
    version="0.1.0",
    description="Rotated object detection ops (RiRoIAlignRotated, RoIPool, depth-aware flow "
                "projection) and a ReDet-like detector for the OpenMMLab stack",
    packages=find_packages(include=["redet_plugin", "redet_plugin.*"]),
    python_requires=">=3.10",
    ext_modules=ext_modules(),
    cmdclass={"build_ext": build_ext_class()},
    zip_safe=False,
)
