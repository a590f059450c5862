"""setup.py's compile flags: ``FASTDPOT_MARCH`` builds the C++ kernels for a named SIMD level instead of the build
machine's (issue 45: the AVX2 code paths are built and tested on an AVX-512 machine with x86-64-v3; a wheel for a
level), ``FASTDPOT_PORTABLE`` for none; by default ``-march=native``."""
import os
import runpy

import pytest
import setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compile_args(monkeypatch, **env):
    for name in ("FASTDPOT_MARCH", "FASTDPOT_PORTABLE", "FASTDPOT_EXT", "FASTDPOT_SKIP_CPP_BUILD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTDPOT_CUDA", "0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(os.path.join(ROOT, "setup.py"))
    exts = seen["ext_modules"]
    assert exts and {e.name for e in exts} >= {"fastdpot._C_flow", "fastdpot._C_flow_histogram"}
    args = {tuple(e.extra_compile_args) for e in exts}
    assert len(args) == 1  # every kernel gets the same flags
    return list(args.pop())


def test_native_by_default(monkeypatch):
    args = _compile_args(monkeypatch)
    assert [a for a in args if a.startswith("-march")] == ["-march=native"]


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4", "znver3"])
def test_fastdpot_march_names_the_target_last(monkeypatch, level):
    args = _compile_args(monkeypatch, FASTDPOT_MARCH=level, FASTDPOT_PORTABLE="1")  # MARCH wins over PORTABLE
    assert [a for a in args if a.startswith("-march")] == [f"-march={level}"]
    assert args[-1] == f"-march={level}"  # after every other flag (CFLAGS come before extra_compile_args)


def test_portable_has_no_march(monkeypatch):
    args = _compile_args(monkeypatch, FASTDPOT_PORTABLE="1")
    assert not [a for a in args if a.startswith("-march")]
