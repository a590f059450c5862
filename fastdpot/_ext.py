"""Loading of optional compiled / third-party backends.

A backend that fails to import is remembered together with the *reason* (the ImportError text) so that asking
for it explicitly raises :class:`BackendUnavailableError` naming what to install. Only ``ImportError`` (and
``OSError`` for shared-library loading) are caught: a syntax or build error inside our own code is never hidden.
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache

__all__ = ["BackendUnavailableError", "load_cpp", "triton_status", "keops_status", "cpp_status"]


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


def keops_status():
    """(available, reason) for pykeops."""
    mod, err = _try_import("pykeops")
    if mod is None:
        return False, f"{err}; install with `pip install pykeops`"
    return True, None
