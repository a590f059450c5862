"""Build script for fastdpot's compiled kernels.

Every ``csrc/<name>.cpp`` becomes its own pybind11 extension ``fastdpot._C_<name>``: plain C++17 + OpenMP on
raw buffers, no torch headers, so torch is not needed to build (and a build-isolated ``pip install .`` never
pulls a CUDA torch). GPU kernels are Triton (``kernels/``, the subpackage ``fastdpot.kernels``): no build step.

``csrc/cuda/<name>.cu`` becomes ``fastdpot._C_cuda_<name>`` (pybind11 on raw device pointers, CUB; no torch headers
either), compiled by ``nvcc`` -- only where the CUDA toolkit is found (``$CUDA_HOME/bin/nvcc``, ``nvcc`` on the PATH
or ``/usr/local/cuda/bin/nvcc``) and the installed torch is a CUDA build (``pip install --no-build-isolation -e .``,
so that the build sees it). Elsewhere it is skipped and the ``cuda`` backend reports itself missing.

Environment flags
-----------------
FASTDPOT_SKIP_CPP_BUILD=1   build nothing compiled (pure-Python install; the ``cpu`` backend reports itself missing)
FASTDPOT_EXT=a,b            build only these extensions (development: rebuild one kernel quickly)
FASTDPOT_PORTABLE=1         compile without -march=native (for wheels that move between machines)
FASTDPOT_MARCH=x86-64-v3    compile for this -march instead of native (a wheel for a SIMD level, or to build and test
                            the AVX2 code paths on an AVX-512 machine: x86-64-v3 is AVX2 + FMA, x86-64-v4 AVX-512)
FASTDPOT_CUDA=0 / 1         never build the CUDA extensions / build them even without a CUDA torch (needs nvcc)
FASTDPOT_CUDA_ARCH=90;80    compute capabilities to build for (default: the visible GPU's, else 80;90)
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _flag(name):
    return os.environ.get(name, "0").lower() in ("1", "true", "yes", "on")


def _only():
    """The extension names of ``FASTDPOT_EXT`` (empty: build every extension)."""
    return {s.strip() for s in os.environ.get("FASTDPOT_EXT", "").split(",") if s.strip()}


def _cpp_extensions():
    if _flag("FASTDPOT_SKIP_CPP_BUILD"):
        return []
    from pybind11.setup_helpers import Pybind11Extension

    only = _only()
    cflags = ["-O3", "-fopenmp", "-fno-math-errno"]
    march = os.environ.get("FASTDPOT_MARCH", "").strip()
    if march:
        cflags.append(f"-march={march}")  # last on the line: it overrides any -march / -m flag of CFLAGS
    elif not _flag("FASTDPOT_PORTABLE"):
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


def _nvcc():
    """Path of nvcc, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for cand in ([os.path.join(home, "bin", "nvcc")] if home else []) + [shutil.which("nvcc") or "",
                                                                        "/usr/local/cuda/bin/nvcc"]:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _torch_cuda():
    """(is a CUDA torch importable, compute capability of GPU 0 or None) -- torch is optional at build time."""
    try:
        import torch
    except ImportError:
        return False, None
    if torch.version.cuda is None:
        return False, None
    cap = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    return True, cap


def _cuda_extensions():
    flag = os.environ.get("FASTDPOT_CUDA", "").lower()
    if flag in ("0", "false", "no", "off") or _flag("FASTDPOT_SKIP_CPP_BUILD"):
        return []
    nvcc = _nvcc()
    has_torch_cuda, cap = _torch_cuda()
    if nvcc is None or not (has_torch_cuda or _flag("FASTDPOT_CUDA")):
        return []
    only = _only()
    archs = os.environ.get("FASTDPOT_CUDA_ARCH") or (f"{cap[0]}{cap[1]}" if cap else "80;90")
    exts = []
    for src in sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu"))):
        name = "cuda_" + os.path.splitext(os.path.basename(src))[0]
        if only and name not in only:
            continue
        ext = Extension(f"fastdpot._C_{name}", [src], depends=glob.glob(os.path.join("csrc", "cuda", "*.cuh")))
        ext.nvcc, ext.cuda_archs = nvcc, [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]
        exts.append(ext)
    return exts


class BuildExt(build_ext):
    """build_ext that hands ``.cu`` extensions to nvcc (one compile-and-link command each); the rest as usual."""

    def build_extension(self, ext):
        if not getattr(ext, "nvcc", None):
            return super().build_extension(ext)
        import pybind11

        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        gencode = []
        for a in ext.cuda_archs:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        gencode += ["-gencode", f"arch=compute_{ext.cuda_archs[-1]},code=compute_{ext.cuda_archs[-1]}"]  # + PTX
        cmd = [ext.nvcc, "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", *gencode,
               "-I", pybind11.get_include(), "-I", sysconfig.get_paths()["include"], *ext.sources, "-o", out]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.check_call(cmd)


packages = find_packages(include=["fastdpot", "fastdpot.*"]) + ["fastdpot.kernels"]

setup(
    packages=packages,
    package_dir={"fastdpot.kernels": "kernels"},
    ext_modules=_cpp_extensions() + _cuda_extensions(),
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
