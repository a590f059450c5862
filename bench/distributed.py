"""Scaling of the sharded flow step (fastdpot.distributed, histogram mode) with gloo processes on this machine, the
bytes communicated per step, and a MODEL of N = 10^9 on 8 GPUs and on 8 nodes.

Weak scaling: N = n_per_process · P; strong scaling: fixed N; P = 1, 2 gloo processes (one thread each). Each run
is a private flow (z = 1, B rows per step, histogram CDF with `bins` bins); the per-step time is the median of
the intervals between consecutive steps on rank 0 (every step ends with an all-reduce, so ranks are in step). The
bytes per step are the message sizes of the collectives (header, release, extremes, counts, flags), counted from
the code's shapes. Rows go to bench/distributed.jsonl; the model is printed (and written to the same file).

    python -m bench.distributed            # sizes of the docs table
    python -m bench.distributed --quick    # tiny sizes, checks that everything runs
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "distributed.jsonl")

# NCCL all-reduce bus bandwidths (nccl-tests `busbw`, large messages) used by the model; see docs/distributed.md
NVLINK = (460e9, 20e-6)  # 8×H100 SXM, NVSwitch: busbw 460-480 GB/s at large sizes; α: assumed 20 µs
NETWORK = (35e9, 60e-6)  # multi-node, 400 Gb/s-class RoCE/InfiniBand: ≈ 35 GB/s busbw; α: assumed 60 µs
# measured one-GPU histogram step (docs/gpu.md: H100, N = 1e7, d = 48, k = 128, 1024 bins: 98 ms)
GPU_SECONDS_PER_PARTICLE_DIRECTION = 0.098 / (1e7 * 128)


def bytes_per_step(k, d, batch, bins, world):
    """Payload bytes of one step's messages and the bytes each rank sends (ring all-reduce: 2(P-1)/P of the
    message; broadcast: the root sends the message once per tree level, counted once here). The broadcasts: the
    go/stop code, the header (key, σ, k, d, L), the (k, d) directions, the (k, B) release and its (B,) levels; the
    all-reduces: 2k extremes, the (k, bins) counts, the non-finite flag and the drift norm."""
    msgs = dict(stop=8, header=5 * 8, directions=k * d * 8, release=k * batch * 8 + batch * 8, extremes=2 * k * 8,
                counts=k * bins * 8, flags=2 * 8)
    ring = 2 * (world - 1) / world
    sent = msgs["stop"] + msgs["header"] + msgs["directions"] + msgs["release"] + \
        ring * (msgs["extremes"] + msgs["counts"] + msgs["flags"])
    return msgs, (sent if world > 1 else 0.0)


def _worker(rank, world, store, out, n, d, k, bins, batch, steps):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from fastdpot.flows import DistributedSlicedWassersteinFlow

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    flow = DistributedSlicedWassersteinFlow(n, d, k, 1.0, diffusion=0.01, noise_multiplier=1.0, batch_size=batch,
                                            steps=steps, quantiles="histogram", histogram_bins=bins, secure_mode=False,
                                   generator=torch.Generator().manual_seed(0), process_group=dist.group.WORLD)
    data = torch.randn(4 * batch, d, generator=torch.Generator().manual_seed(1)) if rank == 0 else None
    stamps = []
    flow.run(data, progress=False, callback=lambda f: stamps.append(time.perf_counter()))
    dt = [b - a for a, b in zip(stamps, stamps[1:])]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(dict(step_s=statistics.median(dt), min_s=min(dt), max_s=max(dt)), f)
    dist.destroy_process_group()


def measure(n, d, k, bins, batch, world, steps, tmp):
    store, out = os.path.join(tmp, f"store-{time.monotonic_ns()}"), os.path.join(tmp, "out.json")
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_worker, args=(r, world, store, out, n, d, k, bins, batch, steps)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    with open(out) as f:
        return json.load(f)


def model(setups, k, bins, batch, d=48, n=10 ** 9, world=8):
    """Per-step time of N = 10^9 particles over `world` ranks: compute (N/P)·k·t_pd + the collectives at the
    assumed bus bandwidths (latency α + bytes/busbw per collective: 4 all-reduces and 6 broadcasts).
    ``setups``: {name: (t_pd seconds per particle·direction, (busbw, α))}."""
    msgs, _ = bytes_per_step(k, d, batch, bins, world)
    rows = []
    for name, (step_s_per_pd, (busbw, alpha)) in setups.items():
        comm = 10 * alpha + sum(msgs.values()) / busbw
        comp = n / world * k * step_s_per_pd
        rows.append(dict(setup=name, particles_per_rank=n // world, compute_s=comp, comm_s=comm,
                         step_s=comp + comm, comm_fraction=comm / (comp + comm)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--note", default="machine shared with other jobs (2 cores, loaded): times are noisy upper "
                                      "bounds")
    a = ap.parse_args(argv)
    d, k, bins, batch = (8, 16, 64, 64) if a.quick else (48, 64, 256, 256)
    per, strong, steps = (2_000, 4_000, 4) if a.quick else (50_000, 100_000, 8)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout
    run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    rows = []
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for kind, world, n in (("weak", 1, per), ("weak", 2, 2 * per), ("strong", 1, strong), ("strong", 2, strong)):
            t = measure(n, d, k, bins, batch, world, steps, tmp)
            msgs, sent = bytes_per_step(k, d, batch, bins, world)
            rows.append(dict(run_id=run_id, git_rev=rev.strip(), suite="distributed", scaling=kind, world=world,
                             n=n, d=d, k=k, bins=bins, batch=batch, **t,
                             s_per_particle_direction=t["step_s"] * world / (n * k), bytes=msgs,
                             bytes_sent_per_rank=sent, note=a.note, quick=a.quick))
            print(json.dumps({x: rows[-1][x] for x in ("scaling", "world", "n", "step_s", "bytes_sent_per_rank")}))
    t_pd = min(r["s_per_particle_direction"] for r in rows if r["world"] == 1)
    big = dict(k=300, bins=1024, batch=256)
    g = GPU_SECONDS_PER_PARTICLE_DIRECTION
    rows_model = model({"8 GPUs, one node (H100, NVLink/NVSwitch, NCCL)": (g, NVLINK),
                        "8 nodes, one H100 each (400 Gb/s-class network, NCCL)": (g, NETWORK),
                        "8 CPU nodes, one process each at this machine's measured per-process speed": (t_pd, NETWORK)},
                       **big)
    out = dict(run_id=run_id, suite="distributed-model", note="MODEL, not a measurement: N = 1e9, d = 48, k = 300, "
               "1024 bins, B = 256", cpu_process_basis_s_per_pd=t_pd, gpu_basis_s_per_pd=g, rows=rows_model)
    print(json.dumps(out, indent=1))
    with open(OUT, "a") as f:
        for r in rows + [out]:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
