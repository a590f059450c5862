"""Checkpoints of a sharded flow (:class:`fastdpot.distributed.DistributedSlicedWassersteinFlow`): a FOLDER with one
file per rank's shard and the data rank's ``main.pt`` (config, world size, step, accounting), written and read
collectively. The methods of :class:`ShardedCheckpointing`, which the sharded flow class inherits (before
:class:`fastdpot.flow.DPSlicedWassersteinFlow`, whose single-file checkpoints a sharded flow does not use).
"""
from __future__ import annotations

import glob
import os

import torch
import torch.distributed as dist

from ._checkpoint import atomic_save

__all__ = ["ShardedCheckpointing"]


def _ckpt_files(path: str, rank: int, world: int):
    return os.path.join(path, "main.pt"), os.path.join(path, f"shard-{rank:05d}-of-{world:05d}-step")


class ShardedCheckpointing:
    """The checkpoint methods of a sharded flow (a mixin: it uses the flow's rank, world size, shard, collectives
    and, on the data rank, the single-flow :meth:`state_dict` / :meth:`load_state_dict`)."""

    def save(self, path: str) -> None:
        """Write a checkpoint to the FOLDER ``path`` (a collective). Every rank writes its shard
        ``shard-<rank>-of-<W>-step<S>.pt``; after a barrier the data rank writes ``main.pt`` (config, world size,
        step S, accountant, its generator state), atomically; after a second barrier older shard files are
        removed. ``main.pt`` always names a step whose shards are complete, so a rank that dies at any point leaves
        the last checkpoint intact. Replayable mode: the files are private artefacts (see the base class)."""
        main, prefix = _ckpt_files(path, self.rank, self.world_size)
        S = self._step
        atomic_save(dict(rank=self.rank, world_size=self.world_size, step=S, shard=self._shard,
                         particles=self._particles.detach().cpu().clone(), last_drift_norm=self._last_drift_norm),
                    f"{prefix}{S:09d}.pt")
        self._collective(dist.barrier) if self.world_size > 1 else None
        if self._is_data():
            state = self.state_dict()
            state.pop("particles")
            state.update(world_size=self.world_size, data_rank=self.data_rank)
            atomic_save(state, main)
        self._collective(dist.barrier) if self.world_size > 1 else None
        for f in glob.glob(f"{glob.escape(prefix)}*.pt"):
            if not f.endswith(f"{S:09d}.pt"):
                os.remove(f)

    @classmethod
    def from_state_dict(cls, state, *, device="cpu", backend="auto"):
        """Not for sharded flows: build the flow on every rank, then :meth:`load_checkpoint`.

        Raises:
            TypeError: always.
        """
        raise TypeError("a sharded flow resumes with flow.load_checkpoint(folder) after building it on every rank")

    @classmethod
    def load(cls, path, *, device="cpu", backend="auto"):
        """Not for sharded flows (see :meth:`from_state_dict`). Raises: TypeError: always."""
        cls.from_state_dict(None)

    def _state_rows(self) -> int:
        return self._shard[1] - self._shard[0]  # the data rank's state carries its own shard's particles

    def load_checkpoint(self, path: str) -> int:
        """Resume from the folder ``path`` written by :meth:`save` (a collective; only the data rank reads
        ``main.pt``, each rank reads its own shard). Returns the step resumed at.

        Raises:
            ValueError (on EVERY rank, nothing changed or released): no checkpoint, a different config, world size
                or data rank than the checkpoint's, a missing or inconsistent shard.
        """
        main, prefix = _ckpt_files(path, self.rank, self.world_size)
        meta, state = None, None
        if self._is_data():
            if not os.path.exists(main):
                meta = f"no checkpoint at {main}"
            else:
                state = torch.load(main, weights_only=False)
                meta = dict(config=state["config"], world_size=state["world_size"], step=state["step"],
                            data_rank=state["data_rank"])
        meta = self._broadcast_object(meta)
        err = ""
        if isinstance(meta, str):
            err = meta
        elif meta["world_size"] != self.world_size:
            err = (f"the checkpoint was written by {meta['world_size']} ranks, this run has {self.world_size}; "
                   f"resume with the same world size")
        elif meta["config"] != self._config or meta["data_rank"] != self.data_rank:
            diff = sorted(k for k in self._config if meta["config"].get(k) != self._config[k])
            err = f"the checkpoint's config differs from this flow's (keys {diff}, data_rank {meta['data_rank']})"
        shard = None
        if not err:
            f = f"{prefix}{int(meta['step']):09d}.pt"
            if not os.path.exists(f):
                err = f"missing shard file {f}"
            else:
                shard = torch.load(f, weights_only=False)
                if tuple(shard["shard"]) != tuple(self._shard) or shard["step"] != meta["step"] or \
                        not bool(torch.isfinite(shard["particles"]).all()):
                    err = f"shard file {f} does not match rank {self.rank}'s shard {self._shard}"
        self._agree(err, "", errors=True)
        if self._is_data():
            state["particles"] = shard["particles"]
            self.load_state_dict(state)
        else:
            self._particles = shard["particles"].clone().to(self.device)
            self._step = int(shard["step"])
        self._last_drift_norm = float(shard["last_drift_norm"])
        return self._step

