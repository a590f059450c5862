"""Particle flows sharded over a ``torch.distributed`` process group (launched by ``torchrun``; gloo or NCCL).

:class:`DistributedSlicedWassersteinFlow` is :class:`~fastdpot.flows.DPSlicedWassersteinFlow` with its N particles
split in contiguous shards (:func:`shard_range`, sizes differ by at most one); rank r moves only its shard. It is
the same flow with three hooks overridden (the run loop, the step and the op are the single flow's):

1. the data rank (the one that holds the private data, rank 0 by default) counts the step in its ledger, samples
   and clips the batch, draws the directions and the step's key, and computes the step's release: the points
   release ``Y Θᵀ + V`` (SECRET noise V from the privacy randomness, then sorted per direction: a quantile table
   at the levels ``m/(B−1)``) or the sketch release's quantile table;
2. it broadcasts whether a step follows, one header (the key, σ of the particles' smoothing noise, sizes), the
   directions and the table;
3. every rank runs op :func:`fastdpot.ops.flow_step` on its shard with a :class:`fastdpot.ops.Shard`
   (global offset, global N, the all-reduce, the all-gather): the op keys every per-particle draw by global index,
   and histogram mode needs one all-reduce (MAX) of each direction's extremes and one (SUM) of the (k, bins) counts:
   O(k·bins) communicated per step, independent of N. Exact mode all-gathers the (N, k) projections (refused above
   ``exact_gather_limit`` elements: use histogram); grid mode is not sharded;
4. one all-reduce of a non-finite flag, so every rank keeps its last particles together.

Privacy: the data rank is the only one that sees private rows or secret noise; every other rank receives exactly the
step's release (which is what the flow publishes anyway) and the step's key, which keys only the particles' draws,
so the guarantee is the one-process flow's (:mod:`fastdpot.flows.flow`), counted once per step by the data rank's
ledger whatever the world size. The initial particles are drawn by global index
(:func:`fastdpot.flows.init.draw_init_keyed`), so a run moves the same particles for every world size.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .._validate import check_int
from ..ops import Shard, step_needs
from .checkpoint import ShardedCheckpointing
from .flow import DPSlicedWassersteinFlow, NonFiniteParticlesError
from .init import draw_init_keyed

__all__ = ["DistributedSlicedWassersteinFlow", "RankFailureError", "shard_range", "make_flow"]

_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


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


def make_flow(*args, process_group=None, **kwargs):
    """A :class:`~fastdpot.flows.DPSlicedWassersteinFlow` (``process_group=None``) or, given a process group, a
    :class:`DistributedSlicedWassersteinFlow` sharded over it (its ``data_rank`` and ``exact_gather_limit`` are
    accepted then). Arguments as the flow classes."""
    if process_group is None:
        return DPSlicedWassersteinFlow(*args, **kwargs)
    return DistributedSlicedWassersteinFlow(*args, process_group=process_group, **kwargs)


class DistributedSlicedWassersteinFlow(ShardedCheckpointing, DPSlicedWassersteinFlow):
    """:class:`~fastdpot.flows.DPSlicedWassersteinFlow` with its N particles sharded over a process group.

    Build it on EVERY rank with the same arguments (checked at construction: a mismatch raises ValueError on every
    rank). The collectives use the group's timeout: a rank that dies or hangs makes the others raise
    :class:`RankFailureError` within it.

    Args (besides those of the base class):
        process_group: the ``torch.distributed`` group the particles are sharded over
            (``torch.distributed.group.WORLD`` after ``init_process_group``).
        data_rank: rank (in the group) that holds the private data, the privacy randomness and the ledger.
        exact_gather_limit: ``quantiles="exact"`` all-gathers the (N, k) projections for a global rank; above
            this many elements construction raises ValueError (use ``quantiles="histogram"``).

    ``num_particles`` stays the global N; :attr:`particles` is the local shard (rows ``shard[0]:shard[1]`` of the
    global order) and :meth:`gather_particles` the full (N, d) tensor on every rank. A string ``init`` is drawn from
    normals keyed by global index (key drawn from the data rank's ``generator``); a tensor ``init`` is the full
    (N, d) start given on every rank. ``checkpoint_path`` (of :meth:`run`, :meth:`save`) is a FOLDER.

    Raises:
        ValueError: as the base class; ``variant="presampled"`` or ``quantiles="grid"`` (not sharded: use
            ``"resample"`` and ``"histogram"``/``"exact"``), a backend whose row of op ``flow_step`` takes no shard
            (the triton/cuda rows; :func:`fastdpot._dispatch.require`);
            N < world size; arguments differing between ranks; torch.distributed not initialised.
    """

    def __init__(self, *args, process_group=None, data_rank: int = 0, exact_gather_limit: int = 1 << 27,
                 **kwargs):
        self._pre_setup(process_group=process_group, data_rank=data_rank, exact_gather_limit=exact_gather_limit)
        self._agree(f"{args!r} {sorted((k, v) for k, v in kwargs.items() if not isinstance(v, (torch.Tensor, torch.Generator)))!r}"
                    f" data_rank={data_rank}", "the flow's arguments")
        super().__init__(*args, **kwargs)

    def _pre_setup(self, process_group=None, data_rank: int = 0, exact_gather_limit: int = 1 << 27):
        if process_group is None:
            raise ValueError("a DistributedSlicedWassersteinFlow needs process_group (use DPSlicedWassersteinFlow for "
                             "one process)")
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

    def _step_needs(self, config):
        """A sharded step: a :class:`fastdpot.ops.Shard`, and a table target (the broadcast release)."""
        return step_needs(table=True, shard=True, **config.step_kwargs())

    def _setup(self, config, **kw):
        c = config
        if c.variant != "resample":
            raise ValueError("a sharded flow supports variant='resample' only")
        if c.quantiles == "grid":
            # the flow's rule, not a backend's: the broadcast release is a table at the levels m/(B−1), which a grid
            # step reads as a table, not by the grid rule of the one-process flow on private rows
            raise ValueError("quantiles='grid' is not sharded; use quantiles='histogram' (or 'exact')")
        if c.quantiles == "exact" and c.num_particles * c.num_projections > self._gather_limit:
            raise ValueError(f"quantiles='exact' on a sharded flow all-gathers the N·k = "
                             f"{c.num_particles * c.num_projections} projections every step (> exact_gather_limit = "
                             f"{self._gather_limit}); use quantiles='histogram'")
        self._shard = shard_range(c.num_particles, self.world_size, self.rank)
        super()._setup(config, **kw)

    # -- communication ------------------------------------------------------------------------------------
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

    def _barrier(self):
        if self.world_size > 1:
            self._collective(dist.barrier)

    def _all_reduce(self, t: torch.Tensor, op: str):
        if self.world_size > 1:
            x = t.to(self._comm).contiguous()
            self._collective(dist.all_reduce, x, op=_REDUCE[op])
            t.copy_(x.to(t.device))

    def _broadcast(self, t: torch.Tensor) -> torch.Tensor:
        x = t.to(self._comm).contiguous()  # a collective sends the storage: a strided view would arrive scrambled
        if self.world_size > 1:
            self._collective(dist.broadcast, x, src=self._src())
        return x.cpu()

    def _broadcast_object(self, obj):
        box = [obj]
        if self.world_size > 1:
            self._collective(dist.broadcast_object_list, box, src=self._src())
        return box[0]

    def _agree(self, mine: str, what: str):
        """All-gather one string per rank; raise ValueError on EVERY rank if they differ."""
        got = [mine]
        if self.world_size > 1:
            got = [None] * self.world_size
            self._collective(dist.all_gather_object, got, mine)
        if any(g != got[0] for g in got):
            diff = [r for r, g in enumerate(got) if g != got[0]]
            raise ValueError(f"{what} differ between ranks (ranks {diff} differ from rank 0); give every rank the "
                             f"same arguments")

    def _agree_errors(self, err: str):
        """All-gather each rank's error message ("" for none); raise ValueError on EVERY rank if any is set."""
        got = [err]
        if self.world_size > 1:
            got = [None] * self.world_size
            self._collective(dist.all_gather_object, got, err)
        bad = [f"rank {r}: {m}" for r, m in enumerate(got) if m]
        if bad:
            raise ValueError("; ".join(bad))

    def _gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        n = self.config.num_particles
        m = -(-n // self.world_size)
        pad = torch.zeros(m, *x.shape[1:], dtype=x.dtype, device=self._comm)
        pad[:x.shape[0]] = x.to(self._comm)
        out = [torch.empty_like(pad) for _ in range(self.world_size)]
        self._collective(dist.all_gather, out, pad)
        sizes = [b - a for a, b in (shard_range(n, self.world_size, r) for r in range(self.world_size))]
        return torch.cat([o[:s] for o, s in zip(out, sizes)]).to(x.device)

    # -- particles ----------------------------------------------------------------------------------------
    @property
    def shard(self):
        """``(start, stop)``: the global indices of this rank's particles."""
        return self._shard

    def _initial_particles(self, init, generator, init_scale) -> torch.Tensor:
        start, stop = self._shard
        if isinstance(init, torch.Tensor):
            return super()._initial_particles(init, generator, init_scale)[start:stop].clone()
        key = int(self._broadcast_object(int(torch.randint(0, 2 ** 62, (1,), generator=generator))
                                         if self._is_data() else None))
        return draw_init_keyed("gaussian" if init is None else init, key, start, stop, self.config.dim, init_scale)

    def _reproduce_init(self, record):
        """This rank's rows of the keyed start that ``record`` reproduces (the key is the data rank's first draw
        from the recorded generator state), None for a given tensor."""
        if record["kind"] == "tensor":
            return None
        g = torch.Generator(device="cpu")
        g.set_state(record["generator"])
        key = int(torch.randint(0, 2 ** 62, (1,), generator=g))
        return draw_init_keyed(record["kind"], key, self._shard[0], self._shard[1], self.config.dim, record["scale"])

    def gather_particles(self) -> torch.Tensor:
        """The full (N, d) particles in global order, on every rank (a collective: call it on every rank)."""
        return self._gather_rows(self._particles.detach()).clone()

    def _op_shard(self) -> Shard:
        return Shard(offset=self._shard[0], num_particles=self.config.num_particles, all_reduce=self._all_reduce,
                     all_gather=self._gather_rows)

    # -- the step's hooks ---------------------------------------------------------------------------------
    def _release_points(self, batch: torch.Tensor, theta: torch.Tensor):
        """Data rank: the points release itself, ``sort(Y Θᵀ + V)`` per direction with secret V ~ N(0, σ²) from the
        privacy randomness, as a quantile table at the levels m/(B−1) (what op ``flow_step`` reads at u·(B−1)); the
        particles keep smoothing noise σ."""
        sigma = float(self.noise_std)
        # float64 on the CPU, where the privacy randomness draws (the release is broadcast from the CPU anyway)
        yp = batch.detach().cpu().double() @ theta.detach().cpu().double().t() \
            + self._rng.normal((batch.shape[0], theta.shape[0])) * sigma
        table = torch.sort(yp.t(), dim=1).values  # sorting is post-processing of the release
        b = batch.shape[0]
        levels = torch.linspace(0, 1, b, dtype=torch.float64) if b > 1 else torch.zeros(1, dtype=torch.float64)
        return dict(sketch=(table, levels), noise_std=sigma)

    def _exchange(self, release):
        """Broadcast the data rank's release (header: key, σ of the particles, k, d, L; then the directions, the table
        and its levels); returns it on every rank."""
        c = self.config
        head = torch.zeros(5, dtype=torch.int64)
        if release is not None:
            table, levels = release["sketch"]
            sigma = torch.tensor([release["noise_std"]], dtype=torch.float64).view(torch.int64)
            head = torch.tensor([release["seed"], int(sigma[0]), c.num_projections, c.dim, table.shape[1]],
                                dtype=torch.int64)
        head = self._broadcast(head)
        k, d, L = (int(v) for v in head[2:5])
        theta = release["projections"].double() if release is not None else torch.empty(k, d, dtype=torch.float64)
        table = release["sketch"][0].double() if release is not None else torch.empty(k, L, dtype=torch.float64)
        levels = release["sketch"][1].double() if release is not None else torch.empty(L, dtype=torch.float64)
        theta, table, levels = self._broadcast(theta), self._broadcast(table), self._broadcast(levels)
        return dict(projections=theta.to(self.device, self._particles.dtype), seed=int(head[0]),
                    sketch=(table, levels), noise_std=float(head[1:2].view(torch.float64)[0]))

    def _accept(self, new: torch.Tensor, drift: torch.Tensor):
        bad = torch.tensor([0.0 if bool(torch.isfinite(new).all()) else 1.0], dtype=torch.float64)
        self._all_reduce(bad, "max")
        if bad.item() > 0:
            raise NonFiniteParticlesError(
                f"flow step {self._step} produced non-finite particles on some rank (step_size="
                f"{self.config.step_size!r}, diffusion={self.config.diffusion!r}); every rank keeps its last finite "
                f"particles")
        self._particles = new
        loc = torch.tensor([float(drift.norm(dim=1).sum())], dtype=torch.float64)
        self._all_reduce(loc, "sum")
        self._last_drift_norm = float(loc.item()) / self.config.num_particles

    def step(self, private_batch: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One sharded step on ``private_batch`` (data rank; None on the others), accounted like the base class's
        :meth:`step` (unsampled). A collective. Returns the local shard."""
        err = ""
        if self._is_data():
            try:
                self._check_step_batch(private_batch)
                self._bind("full", None)
            except (ValueError, TypeError) as e:
                err = str(e)
        elif private_batch is not None:
            err = f"private_batch must be None off the data rank {self.data_rank}"
        self._agree_errors(err)
        if self._is_data() and self.private:
            self._ledger.spend()
        return self._take_step(private_batch if self._is_data() else None)

    # -- the run loop's hooks -----------------------------------------------------------------------------
    def _shows_progress(self) -> bool:
        return self._is_data()

    def _prepare_run(self, private_data, steps, checkpoint_path):
        """Data rank: :meth:`DPSlicedWassersteinFlow._prepare_run`; other ranks: no data. Errors are raised on
        every rank; the steps are the data rank's."""
        err, out = "", (0, None)
        if self._is_data():
            try:
                out = super()._prepare_run(private_data, steps, None)
            except (ValueError, TypeError) as e:
                err = str(e)
        elif private_data is not None:
            err = f"private_data must be None off the data rank {self.data_rank} (it stays on the data rank)"
        if checkpoint_path is not None and not err:
            try:
                self._check_checkpoint_path(checkpoint_path)
            except (ValueError, TypeError) as e:
                err = str(e)
        self._agree_errors(err)
        self._agree(repr(checkpoint_path is None), "checkpoint arguments")
        steps = self._broadcast_object(out[0] if self._is_data() else None)
        return steps, out[1]

    _STOPS = (None, "budget", "planned_steps")

    def _stop_reason(self) -> Optional[str]:
        code = self._STOPS.index(super()._stop_reason()) if self._is_data() else 0
        return self._STOPS[int(self._broadcast(torch.tensor([code], dtype=torch.int64))[0])]

    def _run_step(self, private_data, sampler):
        if self._is_data():
            super()._run_step(private_data, sampler)
        else:
            self._take_step(None)

    def _finish_run(self):
        if self._is_data():
            super()._finish_run()
        eps = self.epsilon() if self._is_data() and self.private else 0.0
        self._eps_cache = float(self._broadcast(torch.tensor([eps], dtype=torch.float64))[0])

    def _save_after_callback_error(self, path):
        """Nothing: a checkpoint is a collective, which one rank's exception cannot start (the last checkpoint and
        its releases in flight stand, as after a crash)."""

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent so far (data rank: the ledger; other ranks: the value broadcast at the end of the last
        :meth:`run`, only for the configured δ; ``inf`` for a non-private flow).

        Raises:
            ValueError: another ``delta`` off the data rank (the ledger lives on the data rank).
        """
        if self._is_data() or not self.private:
            return super().epsilon(delta)
        if delta is not None and delta != self.config.delta:
            raise ValueError(f"the ledger lives on rank {self.data_rank}; ask it for delta={delta!r}")
        return 0.0 if self._eps_cache is None else self._eps_cache
