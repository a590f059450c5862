"""Build script for fastdpot's compiled kernels.

Every ``csrc/<name>.cpp`` becomes its own pybind11 extension ``fastdpot._C_<name>``: plain C++17 + OpenMP on
raw buffers, no torch headers, so torch is not needed to build (and a build-isolated ``pip install .`` never
pulls a CUDA torch). GPU kernels are Triton (``kernels/``, the subpackage ``fastdpot.kernels``): no build step.

Environment flags
-----------------
FASTDPOT_SKIP_CPP_BUILD=1   build nothing compiled (pure-Python install; the ``cpu`` backend reports itself missing)
FASTDPOT_EXT=a,b            build only these extensions (development: rebuild one kernel quickly)
FASTDPOT_PORTABLE=1         compile without -march=native (for wheels that move between machines)
"""
import glob
import os

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


packages = find_packages(include=["fastdpot", "fastdpot.*"]) + ["fastdpot.kernels"]

setup(
    packages=packages,
    package_dir={"fastdpot.kernels": "kernels"},
    ext_modules=_cpp_extensions(),
    zip_safe=False,
)
