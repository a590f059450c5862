"""Build script for fastdpot's compiled kernels.

Every ``csrc/<name>.cpp`` becomes its own pybind11 extension ``fastdpot._C_<name>``: plain C++17 + OpenMP on
raw buffers, no torch headers, so torch is not needed to build (and a build-isolated ``pip install .`` never
pulls a CUDA torch). CUDA sources ``csrc/cuda/*.cu`` are compiled only when a CUDA toolkit *and* a CUDA build of
torch are importable in the build environment (``pip install --no-build-isolation .`` on a GPU machine).

Environment flags
-----------------
FASTDPOT_SKIP_CPP_BUILD=1   build nothing compiled (pure-Python install; the ``cpu`` backend reports itself missing)
FASTDPOT_SKIP_CUDA_BUILD=1  never build CUDA sources
FASTDPOT_FORCE_CUDA_BUILD=1 fail if the CUDA sources cannot be built
FASTDPOT_EXT=a,b            build only these extensions (development: rebuild one kernel quickly)
FASTDPOT_PORTABLE=1         compile without -march=native (for wheels that move between machines)
"""
import glob
import os
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _flag(name):
    return os.environ.get(name, "0").lower() in ("1", "true", "yes", "on")


def _cpp_extensions():
    if _flag("FASTDPOT_SKIP_CPP_BUILD"):
        return []
    from pybind11.setup_helpers import Pybind11Extension

    only = {s.strip() for s in os.environ.get("FASTDPOT_EXT", "").split(",") if s.strip()}
    cflags = ["-O3", "-fopenmp", "-fno-math-errno"]
    if not _flag("FASTDPOT_PORTABLE"):
        cflags.append("-march=native")
    exts = []
    for src in sorted(glob.glob(os.path.join("csrc", "*.cpp"))):
        name = os.path.splitext(os.path.basename(src))[0]
        if only and name not in only:
            continue
        exts.append(
            Pybind11Extension(
                f"fastdpot._C_{name}",
                [src],
                include_dirs=["csrc"],
                cxx_std=17,
                extra_compile_args=cflags,
                extra_link_args=["-fopenmp"],
                depends=glob.glob(os.path.join("csrc", "*.h")),
            )
        )
    return exts


def _cuda_extensions():
    if _flag("FASTDPOT_SKIP_CUDA_BUILD"):
        return [], {}
    sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    force = _flag("FASTDPOT_FORCE_CUDA_BUILD")
    if not sources:
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError as err:  # torch absent from the (isolated) build environment: no CUDA build
        if force:
            raise RuntimeError("FASTDPOT_FORCE_CUDA_BUILD=1 needs torch in the build environment "
                               "(use pip install --no-build-isolation)") from err
        return [], {}
    if CUDA_HOME is None or torch.version.cuda is None:
        if force:
            raise RuntimeError("FASTDPOT_FORCE_CUDA_BUILD=1 but no CUDA toolkit / CUDA build of torch found")
        return [], {}
    exts = [
        CUDAExtension(
            f"fastdpot._cuda_{os.path.splitext(os.path.basename(s))[0]}",
            [s],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math", "-lineinfo"]},
        )
        for s in sources
    ]
    return exts, {"build_ext": BuildExtension}


cuda_exts, cmdclass = _cuda_extensions()
packages = find_packages(include=["fastdpot", "fastdpot.*"]) + ["fastdpot.kernels"]

setup(
    packages=packages,
    package_dir={"fastdpot.kernels": "kernels"},
    ext_modules=_cpp_extensions() + cuda_exts,
    cmdclass=cmdclass,
    zip_safe=False,
)
