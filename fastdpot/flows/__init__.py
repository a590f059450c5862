"""DP sliced-Wasserstein particle flows (Sebag et al., TMLR): one package, one config, one run loop, one step.

Modules, each importing only those listed before it:

* :mod:`~fastdpot.flows.config` — :class:`FlowConfig`, the settings (a frozen dataclass validated once);
* :mod:`~fastdpot.flows.init` — data-independent initial particles;
* :mod:`~fastdpot.flows.run` — the one run loop (:class:`FlowRunResult`);
* :mod:`~fastdpot.flows.checkpoint` — checkpoints of single and sharded flows;
* :mod:`~fastdpot.flows.flow` — :class:`DPSlicedWassersteinFlow` (each step: one release, then op
  :func:`fastdpot.ops.flow_step`);
* :mod:`~fastdpot.flows.labelled` — :class:`LabelledRowsFlow`, the label-private flow on rows [x, c·e_y];
* :mod:`~fastdpot.flows.sharded` — :class:`DistributedSlicedWassersteinFlow` over a ``torch.distributed`` group, and
  :func:`make_flow`, the factory that picks it when a process group is given;
* :mod:`~fastdpot.flows.class_conditional` — :class:`ClassConditionalFlow`;
* :mod:`~fastdpot.flows.allocation` — the one particle allocator (and the samples of released per-class
  Gaussians drawn with it); :mod:`~fastdpot.flows.directions` — public image
  direction sets (orthonormal patch-DCT blocks);
* :mod:`~fastdpot.flows.released` — :class:`ReleasedTargetFlow`, :class:`ReleasedClassFlows`: flows that read only a
  one-shot release (post-processing, no privacy cost).
"""
from .._checkpoint import CheckpointError
from .class_conditional import ClassConditionalFlow
from .config import FlowConfig, LabelledFlowConfig
from .flow import DPSlicedWassersteinFlow, NonFiniteParticlesError
from .init import INIT_KINDS, draw_init
from .labelled import LabelledRowsFlow
from .released import ReleasedClassFlows, ReleasedTargetFlow
from .run import STOP_REASONS, FlowRunResult
from .sharded import DistributedSlicedWassersteinFlow, RankFailureError, make_flow, shard_range

__all__ = ["DPSlicedWassersteinFlow", "ClassConditionalFlow", "LabelledRowsFlow", "DistributedSlicedWassersteinFlow",
           "make_flow", "FlowConfig", "LabelledFlowConfig", "FlowRunResult", "STOP_REASONS", "INIT_KINDS",
           "draw_init", "NonFiniteParticlesError", "RankFailureError", "CheckpointError", "shard_range",
           "ReleasedTargetFlow", "ReleasedClassFlows"]
