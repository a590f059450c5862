"""Per-kernel GPU time of one flow step (torch.profiler, CUDA activity): where the step's time goes.

Usage (CUDA machine): ``python -m bench.gpu_profile [--size N,d,k] [--steps 3] [--backend triton|cuda]``; prints,
for exact and histogram modes, the kernels sorted by total device time over ``steps`` profiled steps (after two
warm-up steps). ``--stages``: the device time of every stage of one chunk of directions for both GPU backends
(``triton``: torch.sort + scattered transport with int64 indices; ``cuda``: CUB sort in place + scattered transport
with int32 indices; the histogram passes), each timed alone with ``triton.testing.do_bench`` (median), scaled to a whole step, beside a device copy of
the chunk (the bandwidth anchor). ``--sweep``: projection-kernel variants. ``--lse N``: the dense Sinkhorn soft-min
against ``torch.logsumexp`` at N = M.
"""
from __future__ import annotations

import argparse
import sys

import torch


def profile_mode(n, d, k, quantiles, steps, backend="triton"):
    from torch.profiler import ProfilerActivity, profile

    from fastdpot.ops import flow_step

    from .gpu_flow_cases import HISTOGRAM_BINS, M_PRIVATE, _inputs

    x, y, th = _inputs(n, M_PRIVATE, d, k, "cuda")
    kw = dict(noise_std=0.5, step_size=1.0, diffusion=1e-3, seed=1234, quantiles=quantiles,
              histogram_bins=HISTOGRAM_BINS if quantiles == "histogram" else None, backend=backend)
    for _ in range(2):
        flow_step(x, y, th, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            flow_step(x, y, th, **kw)
        torch.cuda.synchronize()
    print(f"== {backend} {quantiles}: N={n} d={d} k={k}, {steps} steps (device time per step below is total / "
          f"{steps})")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def sweep_projection(n, d, k):
    """Device time of the fused projection + noise kernel (kernels/projection_noise.py) writing a (k, N) block,
    per variant: noise kind (FAST_NOISE 1 cheap / 0 wide / none), tile shape and warps, dot or broadcast sum.
    Also a plain ``torch.mm`` (IEEE fp32) of the same shapes and a device copy of the output's size as anchors."""
    import triton
    from triton.testing import do_bench

    from fastdpot.kernels._common import acc_dtype
    from fastdpot.kernels.projection_noise import _project_noise_kernel

    from .gpu_flow_cases import _inputs

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


def stages(n, d, k, per_row=None):
    """Device time of each stage of one chunk of kc directions (the default chunk), scaled by k / kc to a step.

    In-place stages (the sorts, the in-place transports) are timed on a fresh copy of their input each run; the
    copy's own time is measured and subtracted. Returns ``{stage: ms per step}`` (also printed)."""
    from triton.testing import do_bench

    from fastdpot._cuda_prims import CUB
    from fastdpot.kernels import histogram
    from fastdpot.kernels._common import direction_chunk
    from fastdpot.kernels.drift import accumulate_drift
    from fastdpot.kernels.projection_noise import project_noise
    from fastdpot.kernels.quantile import transport_exact

    from .gpu_flow_cases import HISTOGRAM_BINS, M_PRIVATE, _inputs

    torch.backends.cuda.matmul.allow_tf32 = False
    x, y, th = _inputs(n, M_PRIVATE, d, k, "cuda")
    kc = direction_chunk(n, k)
    scale = k / kc
    buf = project_noise(x, th, 0, kc, 1234, 0.5, None, fast_noise=True).contiguous()
    src = buf.clone()
    qs = torch.sort(project_noise(y, th, 0, kc, 99, 0.5), dim=1).values
    idx32 = torch.empty((kc, n), dtype=torch.int32, device=x.device)
    drift = torch.zeros((n, d), device=x.device)
    out = {}

    def bench(name, fn, minus=0.0):
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=10, rep=100, return_mode="median") - minus
        out[name] = ms * scale
        print(f"  {name:46s} {ms:9.3f} ms/chunk  {ms * scale:9.3f} ms/step", flush=True)
        return ms

    print(f"== stages: N={n} d={d} k={k}, chunk kc={kc} ({scale:.2f} chunks per step), median of do_bench")
    copy = bench("copy of the (kc, N) chunk (anchor)", lambda: buf.copy_(src))
    bench("project + noise (triton)", lambda: project_noise(x, th, 0, kc, 1234, 0.5, None, out=buf, fast_noise=True))
    bench("project, no noise (triton): the Philox share", lambda: project_noise(x, th, 0, kc, 1234, 0.0, None,
                                                                                out=buf))
    ps, ix64 = torch.sort(src, dim=1)
    bench("torch.sort (int64 indices, copy)", lambda: torch.sort(src, dim=1))
    bench("transport, scattered (int64 idx)", lambda: transport_exact(ps, ix64, qs, buf))
    del ps, ix64

    def cub_fwd():
        buf.copy_(src)
        CUB.argsort_rows_(buf, idx32, per_row=per_row)

    bench("CUB sort fwd (float32 keys, int32 idx)", cub_fwd, copy)
    CUB.argsort_rows_(buf.copy_(src), idx32, per_row=per_row)
    sorted_keys, sorted_idx = buf.clone(), idx32.clone()
    coef = torch.empty_like(buf)
    bench("transport, scattered (int32 idx)", lambda: transport_exact(sorted_keys, sorted_idx, qs, coef))
    bench("drift accumulate (triton, tf32x3)", lambda: accumulate_drift(coef, th, 0, drift, 1.0 / k, first=False,
                                                                     last=False))
    thc = th[:kc].contiguous()
    bench("drift accumulate (cuBLAS addmm, ieee fp32)", lambda: drift.addmm_(coef.t(), thc, alpha=1.0 / k))
    mn, mx = torch.aminmax(src, dim=1)
    lo, width = histogram.bin_geometry(mn, mx, HISTOGRAM_BINS)
    bench("hist: min/max (torch.aminmax)", lambda: torch.aminmax(src, dim=1))
    hist = CUB.hist_count(src, lo, width, HISTOGRAM_BINS)
    bench(f"hist: count ({HISTOGRAM_BINS} bins, shared memory)",
          lambda: CUB.hist_count(src, lo, width, HISTOGRAM_BINS))
    cum = torch.cumsum(hist, dim=1, dtype=torch.int64) - hist

    def hcoef():
        buf.copy_(src)
        CUB.hist_coef_(buf, lo, width, hist, cum, qs)

    bench("hist: transport (in place, shared tables)", hcoef, copy)
    est_exact = sum(out[key] for key in ("project + noise (triton)", "CUB sort fwd (float32 keys, int32 idx)",
                                         "transport, scattered (int32 idx)", "drift accumulate (triton, tf32x3)"))
    est_hist = sum(out[key] for key in ("project + noise (triton)", "hist: min/max (torch.aminmax)",
                                        f"hist: count ({HISTOGRAM_BINS} bins, shared memory)",
                                        "hist: transport (in place, shared tables)",
                                        "drift accumulate (triton, tf32x3)"))
    print(f"  sum of the cuda backend's stages per step: exact {est_exact:.2f} ms, histogram {est_hist:.2f} ms")
    return out


def softmin_lse(n, d=64, eps=0.01, device="cuda"):
    """Device time of one dense soft-min (the Sinkhorn engine's inner step, N = M = n): fastdpot's in-place
    ``_lse_dense`` (max-shifted, clamped exponents: several passes over the (N, M) buffer, written for the CPU)
    against ``torch.logsumexp`` of the materialised ``h - C / eps`` (what GeomLoss' dense engine does)."""
    from triton.testing import do_bench

    from fastdpot.reference.sinkhorn import _lse_dense

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, d, device=device, generator=g)
    y = torch.randn(n, d, device=device, generator=g)
    C = torch.cdist(x, y) ** 2 / 2
    h = torch.randn(n, device=device, generator=g)
    work = torch.empty_like(C)
    a = _lse_dense(eps, C, h, work)
    b = (h[None, :] - C / eps).logsumexp(dim=1)
    print(f"== dense soft-min, N = M = {n}, d = {d}: max |difference| {(a - b).abs().max().item():.3g}")
    for name, fn in (("fastdpot _lse_dense (in place)", lambda: _lse_dense(eps, C, h, work)),
                     ("torch.logsumexp(h - C / eps)", lambda: (h[None, :] - C / eps).logsumexp(dim=1))):
        ms = do_bench(fn, warmup=10, rep=100, return_mode="median")
        print(f"  {name:34s} {ms:8.3f} ms  ({C.numel() * 4 / ms / 1e6:.0f} GB/s per pass over C)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="10000000,48,128")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="only the projection-kernel variant sweep")
    ap.add_argument("--stages", action="store_true", help="only the per-stage timing of both GPU backends")
    ap.add_argument("--per-row", choices=["auto", "yes", "no"], default="auto",
                    help="--stages: CUB sort mode (one onesweep sort per row, or one segmented sort)")
    ap.add_argument("--backend", default="triton", help="backend profiled by the default mode (triton, cuda)")
    ap.add_argument("--lse", type=float, default=None, metavar="N",
                    help="only the dense soft-min comparison at N = M (Sinkhorn's dense engine vs torch.logsumexp)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_profile: no CUDA device; nothing to do")
        return 0
    n, d, k = (int(float(v)) for v in args.size.split(","))
    if args.lse:
        softmin_lse(int(args.lse))
        return 0
    if args.sweep:
        sweep_projection(n, d, k)
        return 0
    if args.stages:
        stages(n, d, k, per_row=dict(auto=None, yes=True, no=False)[args.per_row])
        return 0
    for q in ("exact", "histogram"):
        profile_mode(n, d, k, q, args.steps, args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
