"""The main job's flow stage, sharded over the ranks of ``torchrun -m fastdpot flow --distributed``.

Built on :mod:`fastdpot.flows` (see docs/distributed.md):
:func:`init_from_env` sets up the process group from torchrun's environment; rank 0 runs the pipeline and its
:func:`fastdpot.experiments.mainjob.generation.generate_flow` builds the flow with :func:`pipeline_flow` while the other ranks
:func:`pipeline_follow` it, moving their shards of the particles, until :func:`pipeline_done`.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ...flows import ClassConditionalFlow, DistributedSlicedWassersteinFlow

__all__ = ["init_from_env", "pipeline_done", "pipeline_flow", "pipeline_follow", "pipeline_group",
           "register_pipeline_group"]

_PIPELINE = {}
#: what torchrun sets for every process, and init_process_group("env://") reads
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_from_env(device: str = "cpu", timeout_s: float = 300.0, wait_s: float = 3 * 3600.0):
    """``torch.distributed.init_process_group`` from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...):
    NCCL when ``device`` is CUDA, else gloo; ``timeout_s`` bounds every flow collective (a dead or hanging rank
    is detected within it), ``wait_s`` the wait of ranks > 0 while rank 0 runs the stages before the flow.
    Registers the group for :func:`pipeline_group`. Returns ``(group, rank)``.

    Raises:
        RuntimeError: not under torchrun (its variables unset), before any process group is made.
    """
    import datetime

    missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
    if missing:
        raise RuntimeError(f"--distributed runs under torchrun, which sets {', '.join(missing)}: launch it as "
                           f"`torchrun --nproc_per_node K -m fastdpot flow --distributed ...` (K processes on this "
                           f"machine; docs/distributed.md)")
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    register_pipeline_group(dist.group.WORLD, wait_s)
    return dist.group.WORLD, dist.get_rank()


def register_pipeline_group(group, wait_s: float = 3 * 3600.0):
    """Make :func:`fastdpot.experiments.mainjob.generation.generate_flow` shard its flow over ``group`` (rank 0 of it runs the
    pipeline, the others :func:`pipeline_follow`); None unregisters. A collective (it creates a gloo group for the
    wait)."""
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
    box = [(make_cond, args, {k: v for k, v in kwargs.items() if k != "generator"})]
    dist.broadcast_object_list(box, src=0, group=_PIPELINE["wait"])
    cls = ClassConditionalFlow if make_cond else DistributedSlicedWassersteinFlow
    return cls(*args, **kwargs, process_group=_PIPELINE["group"])


def pipeline_done():
    """Rank 0 of the pipeline: tell the other ranks that no flow stage follows."""
    dist.broadcast_object_list([None], src=0, group=_PIPELINE["wait"])


def pipeline_follow() -> int:
    """Ranks > 0 of the pipeline: for every flow stage of rank 0 (one per flow seed), receive the flow's
    arguments, build the same sharded flow, run it (private data None) and take part in gathering the samples,
    until :func:`pipeline_done`. Returns the number of flow stages followed."""
    done = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=_PIPELINE["wait"])
        if box[0] is None:
            return done
        make_cond, args, kwargs = box[0]
        cls = ClassConditionalFlow if make_cond else DistributedSlicedWassersteinFlow
        flow = cls(*args, **kwargs, generator=torch.Generator().manual_seed(0), process_group=_PIPELINE["group"])
        if make_cond:
            flow.run(None, None, progress=False)
            flow.gather_samples()
        else:
            flow.run(None, progress=False)
            flow.gather_particles()
        done += 1
