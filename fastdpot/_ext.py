"""Loading of optional compiled / third-party backends.

A backend that fails to import is remembered together with the *reason* (the ImportError text) so that asking
for it explicitly raises :class:`BackendUnavailableError` naming what to install. Only ``ImportError`` (and
``OSError`` for shared-library loading) are caught: a syntax or build error inside our own code is never hidden.
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache

__all__ = ["BackendUnavailableError", "load_cpp", "triton_status", "keops_status", "cpp_status", "import_pykeops"]


class BackendUnavailableError(RuntimeError):
    """Raised when a backend is requested explicitly but cannot be loaded."""


_CPP_HINT = ("the C++ extension is not built: run `pip install -e .` (needs gcc and pybind11) "
             "or `FASTDPOT_EXT={name} python setup.py build_ext --inplace`")


@lru_cache(maxsize=None)
def _try_import(modname: str):
    try:
        return importlib.import_module(modname), None
    except (ImportError, OSError) as err:
        return None, f"{type(err).__name__}: {err}"


def load_cpp(name: str):
    """Return the compiled module ``fastdpot._C_<name>`` or raise :class:`BackendUnavailableError`."""
    mod, err = _try_import(f"fastdpot._C_{name}")
    if mod is None:
        raise BackendUnavailableError(f"backend 'cpu' for '{name}' is unavailable ({err}); " + _CPP_HINT.format(name=name))
    return mod



def cpp_status(name: str):
    """(available, reason) for the C++ extension ``name``."""
    mod, err = _try_import(f"fastdpot._C_{name}")
    return mod is not None, err


def triton_status():
    """(usable, reason). Triton is usable on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1."""
    mod, err = _try_import("triton")
    if mod is None:
        return False, f"{err}; install with `pip install triton`"
    return True, None


def triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: KeOps' import-time notices that only say a CPU machine has no CUDA: dropped where torch sees no CUDA either
_KEOPS_CPU_NOTICES = ("CUDA libraries not found or could not be loaded", "no GPUs found on this system")


@lru_cache(maxsize=None)
def import_pykeops():
    """Import pykeops (``(module, None)`` or ``(None, reason)``) without KeOps' "CUDA libraries not found" notice on
    machines where torch sees no CUDA device (the notice is expected there and says nothing); every other line
    KeOps prints at import is passed on to stdout."""
    import contextlib
    import io
    import sys

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod, err = _try_import("pykeops")
    text = buf.getvalue()
    if text:
        cpu_only = True
        try:
            import torch

            cpu_only = not torch.cuda.is_available()
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        keep = [line for line in text.splitlines()
                if line.strip() and not (cpu_only and any(n in line for n in _KEOPS_CPU_NOTICES))]
        if keep:
            sys.stdout.write("\n".join(keep) + "\n")
    return mod, err


def keops_status():
    """(available, reason) for pykeops."""
    mod, err = import_pykeops()
    if mod is None:
        return False, f"{err}; install with `pip install pykeops`"
    return True, None
