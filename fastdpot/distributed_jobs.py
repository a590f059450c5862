"""Sharded class-conditional flows.

Built on :mod:`fastdpot.distributed` (see docs/distributed.md): :func:`run_class_conditional` runs every class flow
of a :class:`fastdpot.flow.ClassConditionalFlow` sharded; :func:`gather_class_samples` gathers their samples.
The main job's sharded flow stage (``fastdpot flow --distributed``: :func:`init_from_env`, :func:`pipeline_flow`,
:func:`pipeline_follow`, :func:`pipeline_done`, ...) lives in :mod:`fastdpot.mainjob.distributed_stage`; its names
are still reachable here, loaded on first use.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ._validate import check_int

# the main job's sharded flow stage, moved to fastdpot.mainjob.distributed_stage: loaded on first use (__getattr__)
_MOVED = ("init_from_env", "pipeline_done", "pipeline_flow", "pipeline_follow", "pipeline_group",
          "register_pipeline_group")
__all__ = ["gather_class_samples", "run_class_conditional", *_MOVED]


def run_class_conditional(ccf, private_data, labels, steps=None, progress=True, checkpoint_path=None,
                          checkpoint_every=None):
    """:meth:`fastdpot.flow.ClassConditionalFlow.run` with every class flow sharded over
    ``ccf.flow_kwargs["process_group"]`` (a collective). ``private_data`` (n, d) and ``labels`` (n,) live on the
    data rank (None elsewhere); the class counts are broadcast from it (they are public in this class's threat
    model). Checkpoints go to ``checkpoint_path/class<c>`` (one folder per class flow). Returns the LOCAL
    ``(samples, labels)``; :func:`gather_class_samples` gives the full ones.

    Raises:
        ValueError (on every rank): bad data or labels on the data rank, data given off it.
    """
    pg = ccf.flow_kwargs["process_group"]
    data_rank = ccf.flow_kwargs.get("data_rank", 0)
    rank = dist.get_rank(pg)
    src = dist.get_global_rank(pg, data_rank) if pg is not None and pg != dist.group.WORLD else data_rank
    box = [None]
    if rank == data_rank:
        try:
            check_int(0 if private_data is None else private_data.dim(), "private_data.dim()", 2)
            if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != private_data.shape[0] \
                    or labels.dtype.is_floating_point or bool((labels < 0).any()):
                raise ValueError(f"labels must be a 1-D integer tensor >= 0 of length {private_data.shape[0]}")
            C = ccf.num_classes if ccf.num_classes is not None else int(labels.max()) + 1
            box = [torch.bincount(labels.long().cpu(), minlength=C).tolist()]
        except ValueError as e:
            box = [f"rank {rank}: {e}"]
    elif private_data is not None or labels is not None:
        box = [f"rank {rank}: private_data and labels must be None off the data rank {data_rank}"]
    errs = [None] * dist.get_world_size(pg)
    dist.all_gather_object(errs, box[0] if isinstance(box[0], str) else "", group=pg)
    if any(errs):
        raise ValueError("; ".join(e for e in errs if e))
    dist.broadcast_object_list(box, src=src, group=pg)
    if not ccf.flows:
        counts = torch.tensor(box[0], dtype=torch.long)
        ccf._build(torch.repeat_interleave(torch.arange(counts.numel()), counts))
    for c, flow in enumerate(ccf.flows):
        part = private_data[labels.to(private_data.device) == c] if rank == data_rank else None
        if progress and rank == data_rank:
            print(f"class {c} of {len(ccf.flows)}", flush=True)
        flow.run(part, steps=steps, progress=progress, progress_epsilon=False, checkpoint_every=checkpoint_every,
                 checkpoint_path=None if checkpoint_path is None else os.path.join(checkpoint_path, f"class{c:03d}"))
    return ccf.samples()


def gather_class_samples(ccf):
    """The full ``(samples (N, d), labels (N,))`` of a sharded :class:`fastdpot.flow.ClassConditionalFlow`, on
    every rank (a collective), class by class in global particle order."""
    xs = [f.gather_particles() for f in ccf.flows]
    return torch.cat(xs), torch.cat([torch.full((x.shape[0],), c, dtype=torch.long) for c, x in enumerate(xs)])


def __getattr__(name):
    if name in _MOVED:
        from .mainjob import distributed_stage

        return getattr(distributed_stage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
