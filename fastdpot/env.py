"""``python -m fastdpot.env``: versions, which backends load, and where the caches live.

A smoke check a user can run after installing (cf. Liger-Kernel's env_report, ``pykeops.test_torch_bindings``).
"""
from __future__ import annotations

import glob
import importlib
import os
import platform
import sys

from . import _dispatch
from ._ext import cpp_status, keops_status, triton_interpret, triton_status


def _version(mod):
    try:
        m = importlib.import_module(mod)
    except ImportError:
        return "not installed"
    return getattr(m, "__version__", "installed")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: the SIMD levels :func:`cpu_simd` and the compiled kernels name (``_C_flow_histogram.simd``), narrowest first
SIMD_LEVELS = ("none", "neon", "sse2", "sse4.2", "avx", "avx2", "avx512")


def cpu_simd(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The widest SIMD level of this CPU among :data:`SIMD_LEVELS`, from the ``flags`` (x86) or ``Features`` (ARM) of
    ``cpuinfo``: ``avx512`` (AVX-512 F), ``avx2`` (AVX2 and FMA), ``avx``, ``sse4.2``, ``sse2``, ``neon``
    (ASIMD); ``none`` where none of these is listed or the file cannot be read. The C++ kernels are compiled for the
    build machine's level (``-march=native``) unless ``FASTDPOT_MARCH`` names another."""
    flags = set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "none"
    for level, needs in (("avx512", {"avx512f"}), ("avx2", {"avx2", "fma"}), ("avx", {"avx"}),
                         ("sse4.2", {"sse4_2"}), ("sse2", {"sse2"}), ("neon", {"asimd"})):
        if needs <= flags:
            return level
    return "none"


def kernel_simd(name: str = "flow_histogram"):
    """The SIMD level the compiled extension ``fastdpot._C_<name>`` was built for (its ``simd`` attribute), or None
    where it is missing or records none."""
    ok, _ = cpp_status(name)
    if not ok:
        return None
    from ._ext import load_cpp

    return getattr(load_cpp(name), "simd", None)


def install_location() -> str:
    """Where pip installed fastdpot, checked against the package this interpreter imports.

    Reads the ``direct_url.json`` of every installed ``fastdpot`` distribution (PEP 610); an editable install whose
    project folder no longer exists, or that is not the imported package's folder, is named as such — the case of a
    clone deleted or moved after ``pip install -e`` (re-run ``bash scripts/setup.sh`` in the clone to use)."""
    import importlib.metadata as md
    import json
    from urllib.parse import unquote, urlparse

    import fastdpot

    here = os.path.dirname(os.path.dirname(os.path.abspath(fastdpot.__file__)))
    for dist in md.Distribution.discover(name="fastdpot"):
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        try:
            info = json.loads(text)
        except ValueError:
            return "pip install record unreadable (direct_url.json)"
        path = unquote(urlparse(info.get("url", "")).path)
        if not info.get("dir_info", {}).get("editable"):
            return f"installed from {path or info.get('url')}"
        if not os.path.isdir(path):
            return (f"WARNING: editable install points at {path}, which no longer exists; imports work only from "
                    f"{here} (run `bash scripts/setup.sh` there)")
        if os.path.realpath(path) != os.path.realpath(here):
            return (f"WARNING: editable install points at {path}, but this interpreter imports {here} "
                    f"(from the working directory)")
        return f"editable install of {path}"
    return f"no pip install record; imported from {here}"


def report() -> str:
    """The environment report as text."""
    import torch

    import fastdpot
    from ._ext import import_pykeops

    import_pykeops()  # first, quietly: KeOps' "CUDA libraries not found" notice is noise on a CPU machine
    lines = [f"fastdpot {fastdpot.__version__} ({os.path.dirname(fastdpot.__file__)})",
             f"install: {install_location()}",
             f"python {sys.version.split()[0]} on {platform.platform()}",
             f"cpu: {cpu_model()}, {os.cpu_count()} logical cores, SIMD {cpu_simd()}, torch threads "
             f"{torch.get_num_threads()}",
             f"cuda: {'available: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'not available'}"]
    lines.append("versions:")
    for mod in ["torch", "numpy", "scipy", "triton", "pykeops", "geomloss", "ot", "dp_accounting", "opacus", "tqdm"]:
        lines.append(f"  {mod:14s} {_version(mod)}")
    lines.append("compiled extensions:")
    here = os.path.dirname(os.path.abspath(__file__))
    names = sorted({os.path.basename(p).split(".")[0][len("_C_"):] for p in glob.glob(os.path.join(here, "_C_*.so"))})
    src = os.path.join(os.path.dirname(here), "csrc")
    names = sorted(set(names) | {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(src, "*.cpp"))})
    if not names:
        lines.append("  (none found)")
    for name in names:
        ok, reason = cpp_status(name)
        simd = kernel_simd(name) if ok else None
        lines.append(f"  _C_{name:12s} {'loaded' if ok else 'MISSING: ' + str(reason)}"
                     f"{f' (built for {simd})' if simd else ''}")
    from ._cuda_prims import cuda_status

    ok, reason = cuda_status()
    lines.append(f"cuda extension (_C_cuda_flow): {'loaded, CUDA device visible' if ok else 'MISSING: ' + str(reason)}")
    ok, reason = triton_status()
    lines.append(f"triton: {'importable' if ok else 'MISSING: ' + str(reason)}"
                 f"{' (TRITON_INTERPRET=1: kernels run on CPU)' if ok and triton_interpret() else ''}")
    ok, reason = keops_status()
    lines.append(f"keops: {'importable' if ok else 'MISSING: ' + str(reason)}")
    lines.append("backends per op:")
    import fastdpot  # noqa: F811  (registers every op)
    for op in _dispatch.registered_ops():
        avail = _dispatch.available_backends(op)
        desc = ", ".join(f"{b}{'' if a[0] else ' (missing)'}" for b, a in avail.items())
        lines.append(f"  {op:28s} {desc}")
    lines.append("caches:")
    keops_dir = os.environ.get("KEOPS_CACHE_FOLDER")
    if keops_dir is None and keops_status()[0]:
        try:
            import pykeops

            keops_dir = pykeops.get_build_folder()
        except (ImportError, AttributeError):
            keops_dir = None
    lines.append(f"  KeOps build folder: {keops_dir or 'n/a'}")
    lines.append(f"  Triton cache: {os.environ.get('TRITON_CACHE_DIR', os.path.expanduser('~/.triton/cache'))}")
    return "\n".join(lines)


def main():
    print(report())


if __name__ == "__main__":
    main()
