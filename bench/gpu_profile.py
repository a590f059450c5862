"""Per-kernel GPU time of one Triton flow step (torch.profiler, CUDA activity): where the step's time goes.

Usage (CUDA machine): ``python -m bench.gpu_profile [--size N,d,k] [--steps 3]``; prints, for exact and histogram
modes, the kernels sorted by total device time over ``steps`` profiled steps (after two warm-up steps).
"""
from __future__ import annotations

import argparse
import sys

import torch


def profile_mode(n, d, k, quantiles, steps):
    from torch.profiler import ProfilerActivity, profile

    from fastdpot.ops.flow_step import flow_step

    from .gpu_flow import M_PRIVATE, NUM_BINS, _inputs

    x, y, th = _inputs(n, M_PRIVATE, d, k, "cuda")
    kw = dict(noise_std=0.5, step_size=1.0, reg=1e-3, seed=1234, quantiles=quantiles,
              num_quantiles=NUM_BINS if quantiles == "histogram" else None, backend="triton")
    for _ in range(2):
        flow_step(x, y, th, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            flow_step(x, y, th, **kw)
        torch.cuda.synchronize()
    print(f"== {quantiles}: N={n} d={d} k={k}, {steps} steps (device time per step below is total / {steps})")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def sweep_projection(n, d, k):
    """Device time of the fused projection + noise kernel (kernels/projection_noise.py) writing a (k, N) block,
    per variant: noise kind (FAST_NOISE 1 cheap / 0 wide / none), tile shape and warps, dot or broadcast sum.
    Also a plain ``torch.mm`` (IEEE fp32) of the same shapes and a device copy of the output's size as anchors."""
    import triton
    from triton.testing import do_bench

    from fastdpot.kernels._common import acc_dtype
    from fastdpot.kernels.projection_noise import _project_noise_kernel

    from .gpu_flow import _inputs

    x, _, th = _inputs(n, 2, d, k, "cuda")
    out = torch.empty((k, n), device="cuda")
    sig = torch.tensor([0.5], device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False

    def launch(bn, bk, bd, use_dot, noise, warps, stages):
        grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
        _project_noise_kernel[grid](x, th, out, out, n, d, k, 0, k, x.stride(0), x.stride(1), th.stride(0),
                                    th.stride(1), 1234, sig, HAS_NOISE=noise is not None, STORE_NOISE=False,
                                    BLOCK_N=bn, BLOCK_K=bk, BLOCK_D=bd, USE_DOT=use_dot, ACC=acc_dtype(x.dtype),
                                    FAST_NOISE=0 if noise in (None, "wide") else 1, num_warps=warps,
                                    num_stages=stages)

    bd = max(16, triton.next_power_of_2(d))
    variants = [("default (64,32) fast", 64, 32, bd, True, "fast", 4, 3),
                ("default (64,32) wide", 64, 32, bd, True, "wide", 4, 3),
                ("default (64,32) no noise", 64, 32, bd, True, None, 4, 3),
                ("(128,32) fast w4", 128, 32, bd, True, "fast", 4, 3),
                ("(128,32) fast w8", 128, 32, bd, True, "fast", 8, 3),
                ("(128,64) fast w8", 128, 64, bd, True, "fast", 8, 3),
                ("(64,64) fast w4", 64, 64, bd, True, "fast", 4, 3),
                ("(32,32) fast w4", 32, 32, bd, True, "fast", 4, 3),
                ("(128,32) no noise w4", 128, 32, bd, True, None, 4, 3),
                ("(64,32) fast no-dot", 64, 32, 16, False, "fast", 4, 3)]
    print(f"== projection kernel sweep: N={n} d={d} k={k} (median ms, do_bench)")
    for name, bn, bk, bdd, dot, noise, warps, stages in variants:
        try:
            ms = do_bench(lambda: launch(bn, bk, bdd, dot, noise, warps, stages), warmup=25, rep=200,
                          return_mode="median")
            print(f"  {name:28s} {ms:8.3f} ms", flush=True)
        except Exception as err:  # a config that does not compile: report, go on
            print(f"  {name:28s} failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}", flush=True)
    ms = do_bench(lambda: torch.mm(th, x.T, out=out), warmup=25, rep=200, return_mode="median")
    print(f"  {'torch.mm (k,d)x(d,N) ieee':28s} {ms:8.3f} ms")
    ms = do_bench(lambda: out.copy_(out.flip(0)), warmup=25, rep=200, return_mode="median")
    print(f"  {'copy of (k,N) (flip)':28s} {ms:8.3f} ms")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="10000000,48,128")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="only the projection-kernel variant sweep")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_profile: no CUDA device; nothing to do")
        return 0
    n, d, k = (int(float(v)) for v in args.size.split(","))
    if args.sweep:
        sweep_projection(n, d, k)
        return 0
    for q in ("exact", "histogram"):
        profile_mode(n, d, k, q, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
