"""The papers' experiments beside the main job: the generator models, evaluations and command lines of DPSWgen
(:mod:`~fastdpot.experiments.papers.dpswgen`), DP-Sinkhorn (:mod:`~fastdpot.experiments.papers.dp_sinkhorn`,
``python -m fastdpot.experiments.papers.dp_sinkhorn``) and the LDP half-circle experiment
(:mod:`~fastdpot.experiments.papers.ldp`, ``python -m fastdpot.experiments.papers.ldp``). The training loops are the
library's (:mod:`fastdpot.dpswgen`, :mod:`fastdpot.dp_sinkhorn`, :mod:`fastdpot.ldp`)."""
