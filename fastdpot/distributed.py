"""Particle flows sharded over a ``torch.distributed`` process group (launched by ``torchrun``; gloo or NCCL).

:class:`DistributedSlicedWassersteinFlow` is what ``DPSlicedWassersteinFlow(..., process_group=pg)`` builds. The
N particles are split in contiguous shards (:func:`shard_range`, sizes differ by at most one); rank r moves only
its shard. Each step (Sebag et al., TMLR, DPSWflow-r, with the sort-free histogram CDF of
:mod:`fastdpot.reference.flow_histogram`):

1. the data rank (the one that holds the private data, rank 0 by default) counts the step in its accountant, samples
   and clips the batch, draws two public seeds (directions, particle noise) and the SECRET Gaussian noise, and
   broadcasts one header (status, the two seeds, σ, sizes) and the release: the (B, k) noisy projections
   ``Y Θᵀ + V`` sorted per direction (``release="points"``) or the (k, L) quantile table of the sketch release;
2. every rank derives Θ from the directions seed and projects its shard; the particle smoothing noise and the
   Brownian term are Philox normals keyed by (seed, stream, global particle index) (:func:`keyed_normals`), so the
   particles do not depend on how they are sharded;
3. histogram mode: one all-reduce (MAX) of each direction's max and −min, one all-reduce (SUM) of the (k, bins)
   counts; each rank maps its projections through the global CDF to the target quantiles and takes the drift and
   Euler--Maruyama update locally: O(k·bins) communicated per step, independent of N. Exact mode all-gathers the
   (N, k) projections for a correct global rank (refused above ``exact_gather_limit`` elements: use histogram);
4. an all-reduce of a non-finite flag, so every rank keeps its last particles together.

Privacy: the data rank is the only one that sees private rows or secret noise; every other rank receives exactly the
step's release (which is what the flow publishes anyway) and public seeds, so the guarantee is the one of the
single-process flow (:mod:`fastdpot.flow`), counted once per step by the data rank's accountant whatever the world
size. Keyed draws use ``fastdpot._C_flow`` (the C++ extension), so a world-size-1 distributed flow draws different
smoothing / Brownian / initial normals than the non-distributed flow (same laws).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ._random import draw_seed, random_directions
from ._validate import check_int
from ._distributed_checkpoint import ShardedCheckpointing
from ._flow_config import is_sampled
from ._flow_init import check_init_kind as _check_init_kind
from .flow import DPSlicedWassersteinFlow, NonFiniteParticlesError, _privacy
from .distributed_phases import (CppHistogramPhases, TorchHistogramPhases, histogram_phases,  # noqa: F401
                                 histogram_reduce, histogram_transport, keyed_normals, transport_move)

__all__ = ["DistributedSlicedWassersteinFlow", "RankFailureError", "TorchHistogramPhases", "CppHistogramPhases",
           "histogram_reduce", "histogram_transport", "transport_move", "keyed_normals", "shard_range"]

from .distributed_phases import _STREAM_BROWNIAN, _STREAM_INIT, _STREAM_SMOOTH  # noqa: E402,F401


class RankFailureError(RuntimeError):
    """A collective failed or timed out (a rank died or hangs); the last complete checkpoint is intact."""


def shard_range(num_particles: int, world_size: int, rank: int):
    """``(start, stop)`` of rank ``rank``'s contiguous shard of N particles; shard sizes differ by at most one
    (the first ``N mod W`` ranks hold one more).

    Raises:
        ValueError: N < W (a rank would hold no particle), rank outside [0, W).
    """
    n, w = check_int(num_particles, "num_particles", 1), check_int(world_size, "world_size", 1)
    r = check_int(rank, "rank", 0)
    if r >= w:
        raise ValueError(f"rank must be < world_size = {w}, got {r}")
    if n < w:
        raise ValueError(f"num_particles = {n} must be >= the world size {w} (every rank holds a shard)")
    base, rem = divmod(n, w)
    start = r * base + min(r, rem)
    return start, start + base + (1 if r < rem else 0)


class DistributedSlicedWassersteinFlow(ShardedCheckpointing, DPSlicedWassersteinFlow):
    """:class:`fastdpot.flow.DPSlicedWassersteinFlow` with its N particles sharded over a process group.

    Build it as ``DPSlicedWassersteinFlow(..., process_group=pg)`` on EVERY rank with the same arguments (checked
    at construction: a mismatch raises ValueError on every rank). ``pg`` is a ``torch.distributed`` process group
    (``torch.distributed.group.WORLD`` after ``init_process_group``). The collectives use the group's timeout: a
    rank that dies or hangs makes the others raise :class:`RankFailureError` within it.

    Args (besides those of the base class):
        process_group: the group the particles are sharded over.
        data_rank: rank (in the group) that holds the private data, the privacy randomness and the accountant.
        exact_gather_limit: ``quantiles="exact"`` all-gathers the (N, k) projections for a global rank; above
            this many elements it raises ValueError (use ``quantiles="histogram"``).

    ``num_particles`` stays the global N; :attr:`particles` is the local shard (rows ``shard[0]:shard[1]`` of the
    global order) and :meth:`gather_particles` the full (N, d) tensor on every rank. A string ``init`` is drawn from
    normals keyed by global index (seed drawn from the data rank's ``generator``); a tensor ``init`` is the full
    (N, d) start given on every rank.

    Raises:
        ValueError: as the base class; ``variant="presampled"`` or ``quantiles="grid"`` (not sharded: use
            ``"resample"`` and ``"histogram"``/``"exact"``); N < world size; arguments differing between ranks.
    """

    def __init__(self, *args, process_group=None, data_rank: int = 0, exact_gather_limit: int = 1 << 27,
                 **kwargs):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group needs torch.distributed initialised (init_process_group / torchrun)")
        self._pg = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.data_rank = check_int(data_rank, "data_rank", 0)
        if self.data_rank >= self.world_size:
            raise ValueError(f"data_rank must be < world size {self.world_size}, got {data_rank}")
        self._gather_limit = check_int(exact_gather_limit, "exact_gather_limit", 1)
        nccl = dist.get_backend(process_group) == "nccl"
        self._comm = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self._shard = None
        self._eps_cache = None
        self.phases = TorchHistogramPhases()  # the fused C++ passes replace it below where they apply
        if kwargs.get("variant", "resample") != "resample":
            raise ValueError("a sharded flow supports variant='resample' only")
        if kwargs.get("quantiles", "exact") == "grid":
            raise ValueError("quantiles='grid' is not sharded; use quantiles='histogram' (or 'exact')")
        n = args[0] if args else kwargs.get("num_particles")
        self._shard = shard_range(n, self.world_size, self.rank)
        self._agree(f"{args!r} {sorted((k, v) for k, v in kwargs.items() if not isinstance(v, (torch.Tensor, torch.Generator)))!r}"
                    f" data_rank={data_rank}", "the flow's arguments")
        super().__init__(*args, **kwargs)
        c = self._config
        if c["quantiles"] == "histogram":  # the fused C++ passes where they apply (BackendUnavailableError when
            self.phases = histogram_phases(self.backend, self.device, self._particles)  # "cpu" is asked but missing)
        if c["quantiles"] == "exact" and c["num_particles"] * c["num_projections"] > self._gather_limit:
            raise ValueError(f"quantiles='exact' on a sharded flow all-gathers the N·k = "
                             f"{c['num_particles'] * c['num_projections']} projections every step (> "
                             f"exact_gather_limit = {self._gather_limit}); use quantiles='histogram'")

    # -- communication helpers ----------------------------------------------------------------------------
    def _is_data(self) -> bool:
        return self.rank == self.data_rank

    def _src(self) -> int:
        return dist.get_global_rank(self._pg, self.data_rank) if self._pg is not None and \
            self._pg != dist.group.WORLD else self.data_rank

    def _collective(self, fn, *a, **kw):
        try:
            return fn(*a, group=self._pg, **kw)
        except (RuntimeError, dist.DistBackendError) as e:  # a dead peer (connection closed) or a timeout
            raise RankFailureError(f"rank {self.rank}: a collective failed or timed out ({e}); a rank died or "
                                   f"hangs. The last complete checkpoint is intact; resume from it") from e

    def _all_reduce(self, t, op):
        if self.world_size > 1:
            x = t.to(self._comm)
            self._collective(dist.all_reduce, x, op=op)
            t.copy_(x.to(t.device))

    def _broadcast(self, t):
        x = t.to(self._comm)
        if self.world_size > 1:
            self._collective(dist.broadcast, x, src=self._src())
        return x.cpu()

    def _broadcast_object(self, obj):
        box = [obj]
        if self.world_size > 1:
            self._collective(dist.broadcast_object_list, box, src=self._src())
        return box[0]

    def _agree(self, mine: str, what: str, errors: bool = False):
        """All-gather one string per rank; raise ValueError on EVERY rank if they differ (or, with ``errors``,
        if any rank's string is a non-empty error message)."""
        got = [None] * self.world_size
        if self.world_size > 1:
            self._collective(dist.all_gather_object, got, mine)
        else:
            got = [mine]
        if errors:
            bad = [f"rank {r}: {m}" for r, m in enumerate(got) if m]
            if bad:
                raise ValueError("; ".join(bad))
        elif any(g != got[0] for g in got):
            diff = [r for r, g in enumerate(got) if g != got[0]]
            raise ValueError(f"{what} differ between ranks (ranks {diff} differ from rank 0); give every rank the "
                             f"same arguments")

    # -- particles ----------------------------------------------------------------------------------------
    @property
    def shard(self):
        """``(start, stop)``: the global indices of this rank's particles."""
        return self._shard

    def _initial_particles(self, init, n, d, generator, init_scale) -> torch.Tensor:
        start, stop = self._shard
        if isinstance(init, torch.Tensor):
            return super()._initial_particles(init, n, d, generator, init_scale)[start:stop].clone()
        kind = "gaussian" if init is None else init
        _check_init_kind(kind)
        seed = int(self._broadcast(torch.tensor([draw_seed(generator)], dtype=torch.int64))[0])
        x = keyed_normals(seed, _STREAM_INIT, start, stop - start, d)
        if kind == "sphere":
            x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        elif kind == "gaussian_scaled":
            x = x / math.sqrt(d)
        return x * init_scale if init_scale != 1.0 else x

    def gather_particles(self) -> torch.Tensor:
        """The full (N, d) particles in global order, on every rank (a collective: call it on every rank)."""
        x = self._particles.detach()
        if self.world_size == 1:
            return x.clone()
        return self._gather_rows(x)

    def _gather_rows(self, x):
        m = -(-self._config["num_particles"] // self.world_size)
        pad = torch.zeros(m, *x.shape[1:], dtype=x.dtype, device=self._comm)
        pad[:x.shape[0]] = x.to(self._comm)
        out = [torch.empty_like(pad) for _ in range(self.world_size)]
        self._collective(dist.all_gather, out, pad)
        n = self._config["num_particles"]
        parts = [o[:shard_range(n, self.world_size, r)[1] - shard_range(n, self.world_size, r)[0]]
                 for r, o in enumerate(out)]
        return torch.cat(parts).to(x.device)

    # -- one sharded step ---------------------------------------------------------------------------------
    def _local_step(self, theta, target, sigma, noise_seed):
        """Move this rank's shard given the step's broadcast release ``target`` (``("points", sorted (B, k))`` or
        ``("sketch", table (k, L), levels (L,))``)."""
        c = self._config
        x = self._particles
        dt, (start, stop) = x.dtype, self._shard
        n_loc, d = x.shape
        k = theta.shape[0]
        th = theta.to(x.device, dt)
        N, h = c["num_particles"], c["step_size"]
        if c["quantiles"] == "histogram":
            new, drift = self.phases.histogram_step(x, th, target, sigma, noise_seed, start, c["num_quantiles"], N,
                                                    h, c["reg"], self._all_reduce)
        else:  # exact: the global rank from the all-gathered projections (stable, by global index)
            noise = None
            if sigma > 0:
                noise = keyed_normals(noise_seed, _STREAM_SMOOTH, start, n_loc, k, dt).to(x.device) * sigma
            s = x @ th.t() if noise is None else x @ th.t() + noise
            br = (keyed_normals(noise_seed, _STREAM_BROWNIAN, start, n_loc, d, dt).to(x.device) if c["reg"] > 0
                  else None)
            scale = math.sqrt(2.0 * c["reg"] * h)
            full = self._gather_rows(s) if self.world_size > 1 else s
            order = torch.argsort(full.t().contiguous(), dim=1, stable=True)
            ranks = torch.empty_like(order)
            ranks.scatter_(1, order, torch.arange(N, device=order.device).expand(k, N).contiguous())
            u = ranks[:, start:stop].t().to(torch.float64) / (N - 1)
            new, drift = transport_move(x, s, th, u, target, h, scale, br)
        bad = torch.tensor([0.0 if bool(torch.isfinite(new).all()) else 1.0], dtype=torch.float64)
        self._all_reduce(bad, dist.ReduceOp.MAX)
        self._step += 1
        if bad.item() > 0:
            raise NonFiniteParticlesError(
                f"flow step {self._step} produced non-finite particles on some rank (step_size={c['step_size']!r},"
                f" reg={c['reg']!r}); every rank keeps its last finite particles")
        self._particles = new
        loc = torch.tensor([float(drift.norm(dim=1).sum())], dtype=torch.float64)
        self._all_reduce(loc, dist.ReduceOp.SUM)
        self._last_drift_norm = float(loc.item()) / N

    def _release(self, batch):
        """Data rank: clip, draw the public seeds and the secret noise, release. Returns the header and payload."""
        c = self._config
        batch = self._clip(batch.to(torch.float64))
        dir_seed, noise_seed = self._rng.seed(), self._rng.seed()
        theta = self._theta(dir_seed)
        sigma = float(self.noise_std)
        if c["release"] == "sketch":
            p = _privacy()
            sk = p.sliced_quantile_sketch(batch, theta, c["num_bins"], sigma, radius=c["radius"],
                                          normalize=c["normalize"], generator=self._rng)
            table, levels = p.sketch.sketch_quantile_table(sk)
            payload = torch.cat([table.double(), levels.double().unsqueeze(0)])  # (k + 1, L)
            sigma_particles = 0.0
        else:
            yp = batch @ theta.t() + self._rng.normal((batch.shape[0], theta.shape[0])) * sigma
            payload = torch.sort(yp, dim=0).values  # sorting is post-processing of the release
            sigma_particles = sigma
        bits = torch.tensor([sigma_particles], dtype=torch.float64).view(torch.int64)
        head = torch.tensor([1, dir_seed, noise_seed, int(bits[0]), payload.shape[0], payload.shape[1]],
                            dtype=torch.int64)
        return head, payload

    def _theta(self, dir_seed):
        c = self._config
        g = torch.Generator().manual_seed(int(dir_seed))
        return random_directions(c["num_projections"], c["dim"], g, orthogonal=c["directions"] == "orthogonal")

    def _exchange(self, head, payload):
        """Broadcast the header (stop when status 0) and the release from the data rank; move the local shard."""
        head = self._broadcast(head if head is not None else torch.zeros(6, dtype=torch.int64))
        if int(head[0]) == 0:
            return False
        rows, cols = int(head[4]), int(head[5])
        payload = self._broadcast(payload if payload is not None else torch.empty(rows, cols, dtype=torch.float64))
        sigma = float(head[3:4].view(torch.float64)[0])
        target = ("points", payload) if self._config["release"] == "points" else \
            ("sketch", payload[:-1], payload[-1])
        self._local_step(self._theta(int(head[1])), target, sigma, int(head[2]))
        return True

    def step(self, private_batch: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One sharded step on ``private_batch`` (data rank; None on the others), accounted like the base class's
        :meth:`step` (unsampled). A collective. Returns the local shard."""
        err = ""
        if self._is_data():
            try:
                self._check_batch(private_batch, "private_batch")
                self._bind("full", None)
            except ValueError as e:
                err = str(e)
        elif private_batch is not None:
            err = f"private_batch must be None off the data rank {self.data_rank}"
        self._agree(err, "", errors=True)
        head = payload = None
        if self._is_data():
            if self.private:
                self._ledger.spend()
            head, payload = self._release(private_batch)
        self._exchange(head, payload)
        return self._particles

    def run(self, private_data: Optional[torch.Tensor] = None, steps: Optional[int] = None, progress: bool = True,
            checkpoint_path: Optional[str] = None, checkpoint_every: Optional[int] = None,
            callback: Optional[Callable[["DistributedSlicedWassersteinFlow"], None]] = None,
            progress_epsilon: bool = True) -> torch.Tensor:
        """:meth:`fastdpot.flow.DPSlicedWassersteinFlow.run`, sharded; a collective (call it on every rank).

        ``private_data`` (n, d) on the data rank, None on the others; ``steps`` is read on the data rank;
        ``checkpoint_path`` is a FOLDER (see :meth:`save`). Returns the local shard.

        Raises:
            ValueError (on every rank): bad data on the data rank, data given off it, different checkpoint
                arguments between ranks. RankFailureError: a rank died or hung (group timeout).
        """
        from tqdm.auto import tqdm

        err, c, sampler = "", self._config, None
        if self._is_data():
            try:
                self._check_batch(private_data, "private_data")
                steps = (c["steps"] - self._step if c["steps"] is not None else None) if steps is None else \
                    check_int(steps, "steps", 0)
                if steps is None:
                    raise ValueError("steps is required: this flow has no planned number of steps")
                n = private_data.shape[0]
                if is_sampled(c):
                    self._bind("sampled", n)
                    sampler = _privacy().FixedSizeSampler(n, self._bound_batch, generator=self._rng)
                else:
                    self._bind("full", None)
            except ValueError as e:
                err = str(e)
        elif private_data is not None:
            err = f"private_data must be None off the data rank {self.data_rank} (it stays on the data rank)"
        if checkpoint_every is not None and not err:
            try:
                checkpoint_every = check_int(checkpoint_every, "checkpoint_every", 1)
            except ValueError as e:
                err = str(e)
        self._agree(err, "", errors=True)
        self._agree(repr((checkpoint_path is None, checkpoint_every)), "checkpoint arguments")
        bar = tqdm(total=steps, disable=not (progress and self._is_data()), desc="DP-SW flow (sharded)")
        try:
            done = 0
            while True:
                head = payload = None
                if self._is_data():
                    go = done < steps and (not self.private or self.can_step())
                    if go:
                        if self.private:
                            self._ledger.spend()  # counted once, on the data rank, before anything is released
                        head, payload = self._release(private_data[sampler.sample()] if sampler is not None
                                                      else private_data)
                if not self._exchange(head, payload):
                    break
                done += 1
                if callback is not None:
                    callback(self)
                if checkpoint_path is not None and checkpoint_every is not None and \
                        self._step % checkpoint_every == 0:
                    self.save(checkpoint_path)
                bar.update(1)
        finally:
            bar.close()
            if self.private:
                self._ledger.flush()
        if checkpoint_path is not None:
            self.save(checkpoint_path)
        self._eps_cache = float(self._broadcast(torch.tensor([self.epsilon() if self._is_data() else 0.0],
                                                              dtype=torch.float64))[0])
        return self._particles

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent so far (data rank: the accountant; other ranks: the value broadcast at the end of the last
        :meth:`run`, only for the configured δ; ``inf`` for a non-private flow).

        Raises:
            ValueError: another ``delta`` off the data rank (the accountant lives on the data rank).
        """
        if self._is_data() or not self.private:
            return super().epsilon(delta)
        if delta is not None and delta != self._config["delta"]:
            raise ValueError(f"the accountant lives on rank {self.data_rank}; ask it for delta={delta!r}")
        return 0.0 if self._eps_cache is None else self._eps_cache
