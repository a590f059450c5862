"""Ahead-of-time compilation of every Triton kernel for real GPU targets (sm_90 H100, sm_80 A100), without a GPU.

The interpreter (TRITON_INTERPRET=1) runs the kernels' Python bodies with numpy and checks their arithmetic; it does
not run Triton's compiler. This file compiles each kernel, in the constexpr variants the launchers use, through the
whole pipeline to a cubin with Triton's bundled ptxas, so that type errors, unsupported operations (float64 dot or
atomics, 64-bit Philox counters) and constexpr mistakes that only the compiled path would hit are caught here.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - older Triton without these entry points
    pytest.skip("this Triton has no ASTSource/GPUTarget AOT entry points", allow_module_level=True)

from fastdpot.kernels import dpswd, drift, histogram, projection_noise, quantile  # noqa: E402

pytestmark = pytest.mark.triton

_FP = {"fp32": tl.float32, "fp64": tl.float64}
# pointer arguments that hold integers (everything else named *_ptr holds the data dtype)
_INT_PTRS = {"index_ptr": "*i64", "lidx_ptr": "*i64", "sidx_ptr": "*i64", "j_ptr": "*i64", "hist_ptr": "*i32",
             "cum_ptr": "*i64", "bn_ptr": "*i32", "seg_ptr": "*i64", "idx_ptr": "*i64"}
_I64 = {"seed", "seed_b"}


def _compile(kernel, dt, consts, target):
    consts = dict(consts)
    options = {"num_warps": consts.pop("_num_warps")} if "_num_warps" in consts else None
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in _INT_PTRS:
            sig[name] = _INT_PTRS[name]
        elif name.endswith("_ptr"):
            sig[name] = "*" + dt
        else:
            sig[name] = "i64" if name in _I64 else "i32"
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=target, options=options)


def _proj_consts(dt, store=True, fast_noise=1):
    """FAST_NOISE 1: the particles' cheap normals on aligned tiles (the hot path); 0: randn_wide; 2: unaligned."""
    bn, bk, bd, dot = projection_noise.tile_config(torch.float32 if dt == "fp32" else torch.float64, 48)
    return dict(HAS_NOISE=True, BLOCK_N=bn, BLOCK_K=bk, BLOCK_D=bd, USE_DOT=dot, ACC=_FP[dt], FAST_NOISE=fast_noise)


CASES = [
    ("project_noise", projection_noise._project_noise_kernel, "fp32",
     lambda dt: dict(_proj_consts(dt), STORE_NOISE=True)),
    ("project_noise", projection_noise._project_noise_kernel, "fp64",
     lambda dt: dict(_proj_consts(dt), STORE_NOISE=True)),
    ("project_noise_wide", projection_noise._project_noise_kernel, "fp32",
     lambda dt: dict(_proj_consts(dt, fast_noise=0), STORE_NOISE=True)),
    ("project_noise_unaligned", projection_noise._project_noise_kernel, "fp32",
     lambda dt: dict(_proj_consts(dt, fast_noise=2), STORE_NOISE=False)),
    ("transport_exact", quantile._transport_exact_kernel, "fp32", lambda dt: dict(BLOCK=1024)),
    ("transport_grid", quantile._transport_grid_kernel, "fp32", lambda dt: dict(BLOCK=1024)),
    ("drift_update", drift._drift_kernel, "fp32",
     lambda dt: dict(FIRST=False, LAST=True, UPDATE=True, BROWNIAN=True, STORE_BROWN=True, BLOCK_N=64, BLOCK_D=64,
                     BLOCK_K=16, USE_DOT=True, ACC=tl.float32)),
    ("drift_update", drift._drift_kernel, "fp64",
     lambda dt: dict(FIRST=True, LAST=True, UPDATE=True, BROWNIAN=False, STORE_BROWN=False, BLOCK_N=32,
                     BLOCK_D=16, BLOCK_K=8, USE_DOT=False, ACC=tl.float64)),
    ("hist_minmax", histogram._minmax_kernel, "fp32", lambda dt: dict(_proj_consts(dt), STORE_NOISE=True)),
    ("hist_count", histogram._hist_kernel, "fp32", lambda dt: dict(_proj_consts(dt), HISTOGRAM_BINS=1024)),
    ("hist_transport", histogram._hist_transport_kernel, "fp32", lambda dt: dict(_proj_consts(dt), HISTOGRAM_BINS=1024)),
    ("hist_drift_fused", histogram._hist_drift_kernel, "fp32",
     lambda dt: dict(HAS_NOISE=True, HISTOGRAM_BINS=1024, BROWNIAN=True, STORE_BROWN=True, BLOCK_N=64, BLOCK_K=32,
                     BLOCK_D=64, USE_DOT=True, ACC=tl.float32, FAST_NOISE=1, _num_warps=8)),
    ("hist_drift_fused", histogram._hist_drift_kernel, "fp64",
     lambda dt: dict(HAS_NOISE=True, HISTOGRAM_BINS=64, BROWNIAN=False, STORE_BROWN=False, BLOCK_N=16, BLOCK_K=8,
                     BLOCK_D=16, USE_DOT=False, ACC=tl.float64, FAST_NOISE=1)),
    ("w1d_p2", dpswd._w1d_kernel, "fp32", lambda dt: dict(P_MODE=2, NEED_GL=True, NEED_GS=True, BLOCK=1024)),
    ("w1d_pany", dpswd._w1d_kernel, "fp64", lambda dt: dict(P_MODE=0, NEED_GL=True, NEED_GS=True, BLOCK=1024)),
    ("w1d_p1", dpswd._w1d_kernel, "fp32", lambda dt: dict(P_MODE=1, NEED_GL=False, NEED_GS=True, BLOCK=1024)),
    # the sketch release (float64 bin sums, tables and partial losses; the fp32 data variant differs only in loads)
    ("sketch_bin_means", dpswd._bin_means_kernel, "fp64", lambda dt: dict(HAS_NOISE=True, BLOCK=1024)),
    ("sketch_isotonic", dpswd._isotonic_kernel, "fp64", lambda dt: dict(_num_warps=1)),
    ("sketch_loss", dpswd._sketch_loss_kernel, "fp64",
     lambda dt: dict(ONE_BIN=False, P_MODE=2, NEED_G=True, BLOCK=1024)),
]


# default run (time budget of the interpreter test run): five float32 kernels -- projection, exact transport, drift,
# the fused histogram pass 3, DP-SWD p = 2 -- and the sketch's isotonic fit (a while loop over a scratch stack);
# every variant (float64, grid, histogram passes 1-2, chunked pass 3, p = 1, any p, the sketch's other kernels) for
# sm_90 and sm_80 under -m slow (all compiled cleanly when this was written)
FAST = {("project_noise", "fp32"), ("transport_exact", "fp32"), ("drift_update", "fp32"),
        ("hist_drift_fused", "fp32"), ("w1d_p2", "fp32"), ("sketch_isotonic", "fp64")}


def compile_all(arch, everything=True):
    """Compile the cases for ``cuda`` sm_<arch>; returns {case id: error text or None}."""
    out = {}
    for name, kernel, dt, consts in CASES:
        if not everything and (name, dt) not in FAST:
            continue
        try:
            compiled = _compile(kernel, dt, consts(dt), GPUTarget("cuda", arch, 32))
            ok = bool(compiled.asm["cubin"]) and ".entry" in compiled.asm["ptx"]
            out[f"{name}-{dt}"] = None if ok else "empty cubin / no kernel entry in the PTX"
        except Exception as err:  # report every failing kernel, not only the first
            out[f"{name}-{dt}"] = f"{type(err).__name__}: {str(err)[:2000]}"
    return out


def _compile_in_subprocess(arch, everything):
    """Triton's compiler needs real @triton.jit functions; under TRITON_INTERPRET=1 the decorator returns
    interpreter objects, so compile in a fresh process with the interpreter switched off."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(arch), str(int(everything))], env=env,
                          cwd=root,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@COMPILE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("@@COMPILE "):])


def test_float32_kernels_compile_for_h100():
    result = _compile_in_subprocess(90, everything=False)
    assert len(result) == len(FAST)
    failures = {k: v for k, v in result.items() if v is not None}
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80])
def test_every_kernel_compiles(arch):
    result = _compile_in_subprocess(arch, everything=True)
    assert len(result) == len(CASES)
    failures = {k: v for k, v in result.items() if v is not None}
    assert not failures, failures


if __name__ == "__main__":
    print("@@COMPILE " + json.dumps(compile_all(int(sys.argv[1]), everything=sys.argv[2] == "1")), flush=True)
