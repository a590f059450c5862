"""Sharded class-conditional flows and the main job's sharded flow stage (``fastdpot flow --distributed``).

Built on :mod:`fastdpot.distributed` (see docs/distributed.md): :func:`run_class_conditional` runs every class flow
of a :class:`fastdpot.flow.ClassConditionalFlow` sharded; :func:`init_from_env`, :func:`pipeline_flow`,
:func:`pipeline_follow` and :func:`pipeline_done` let rank 0 run the pipeline while the other ranks move their
shards of its flow stage.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ._validate import check_int
from .distributed import DPSlicedWassersteinFlow

__all__ = ["gather_class_samples", "init_from_env", "pipeline_done", "pipeline_flow", "pipeline_follow",
           "pipeline_group", "register_pipeline_group", "run_class_conditional"]


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


# -- the main job's flow stage, sharded (``fastdpot flow --distributed`` under torchrun) ----------------------
_PIPELINE = {}


def init_from_env(device: str = "cpu", timeout_s: float = 300.0, wait_s: float = 3 * 3600.0):
    """``torch.distributed.init_process_group`` from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...):
    NCCL when ``device`` is CUDA, else gloo; ``timeout_s`` bounds every flow collective (a dead or hanging rank
    is detected within it), ``wait_s`` the wait of ranks > 0 while rank 0 runs the stages before the flow.
    Registers the group for :func:`pipeline_group`. Returns ``(group, rank)``."""
    import datetime

    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    register_pipeline_group(dist.group.WORLD, wait_s)
    return dist.group.WORLD, dist.get_rank()


def register_pipeline_group(group, wait_s: float = 3 * 3600.0):
    """Make :func:`fastdpot.pipeline.stage_flow` shard its flow over ``group`` (rank 0 of it runs the pipeline,
    the others :func:`pipeline_follow`); None unregisters. A collective (it creates a gloo group for the wait)."""
    import datetime

    _PIPELINE.clear()
    if group is not None:
        _PIPELINE["group"] = group
        _PIPELINE["wait"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=wait_s))


def pipeline_group():
    """The process group of ``fastdpot flow --distributed`` (None when not distributed)."""
    return _PIPELINE.get("group")


def pipeline_flow(make_cond: bool, args, kwargs):
    """Rank 0 of the pipeline: send the flow's arguments to the other ranks, build it sharded."""
    from .flow import ClassConditionalFlow

    box = [(make_cond, args, {k: v for k, v in kwargs.items() if k != "generator"})]
    dist.broadcast_object_list(box, src=0, group=_PIPELINE["wait"])
    cls = ClassConditionalFlow if make_cond else DPSlicedWassersteinFlow
    return cls(*args, **kwargs, process_group=_PIPELINE["group"])


def pipeline_done():
    """Rank 0 of the pipeline: tell the other ranks that no flow stage follows."""
    dist.broadcast_object_list([None], src=0, group=_PIPELINE["wait"])


def pipeline_follow() -> int:
    """Ranks > 0 of the pipeline: for every flow stage of rank 0 (one per flow seed), receive the flow's
    arguments, build the same sharded flow, run it (private data None) and take part in gathering the samples,
    until :func:`pipeline_done`. Returns the number of flow stages followed."""
    from .flow import ClassConditionalFlow

    done = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=_PIPELINE["wait"])
        if box[0] is None:
            return done
        make_cond, args, kwargs = box[0]
        cls = ClassConditionalFlow if make_cond else DPSlicedWassersteinFlow
        flow = cls(*args, **kwargs, generator=torch.Generator().manual_seed(0), process_group=_PIPELINE["group"])
        if make_cond:
            flow.run(None, None, progress=False)
            gather_class_samples(flow)
        else:
            flow.run(None, progress=False)
            flow.gather_particles()
        done += 1
