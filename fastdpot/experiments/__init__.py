"""The applications built on the library: the main job ``fastdpot flow`` (private image generation with a DP
sliced-Wasserstein flow in an auto-encoder's latent space, docs/mainjob.md), its private-only protocol
(``--public-size 0``, docs/mainjob-private.md), and the experiments of the other methods (DPSWgen, DP-Sinkhorn, LDP).
They use the library (:mod:`fastdpot.flows`, :mod:`fastdpot.privacy`, ...); the library never imports them, and
``import fastdpot`` does not load them.

Modules, in the order a run uses them:

* :mod:`~fastdpot.experiments.cli` — the ``fastdpot flow`` command line (``python -m fastdpot flow``, also under
  ``torchrun -m fastdpot flow --distributed``).
* :mod:`~fastdpot.experiments.config` — :class:`~fastdpot.experiments.config.PipelineConfig`, the settings of one run.
* :mod:`~fastdpot.experiments.pipeline` — :func:`~fastdpot.experiments.pipeline.run_pipeline`, which chains the stages and
  writes the run folder; every stage function can be imported from it.
* :mod:`~fastdpot.experiments.data` — image loaders (IDX, Fashion-MNIST from the Debian package, CelebA folders,
  scikit-learn fallbacks) and the seeded public/private split.
* :mod:`~fastdpot.experiments.autoencoder` — the auto-encoders trained on the public half, and their cache.
* :mod:`~fastdpot.experiments.stages` — the public stages: data, auto-encoder, spread calibration, decoding, metrics.
* :mod:`~fastdpot.experiments.flow_stage` — the private stage: the DP flow on the private latents.
* :mod:`~fastdpot.experiments.distributed_stage` — that flow stage sharded over torchrun's ranks (``--distributed``).
* :mod:`~fastdpot.experiments.baselines` — the DP Gaussian per class and public-only baselines (``--method``).
* :mod:`~fastdpot.experiments.metrics` — FID and downstream classifiers (LogReg, MLP, CNN).
* :mod:`~fastdpot.experiments.report` — ``samples.png``, ``metrics.json``, ``privacy.md``.
* :mod:`~fastdpot.experiments.tuning` — the public-only hyper-parameter sweep
  (``python -m fastdpot.experiments.tuning``).
* :mod:`~fastdpot.experiments.private_only` — the private-only protocol (``fastdpot flow --public-size 0``), with
  :mod:`~fastdpot.experiments.dp_representation` (the DP-SGD auto-encoder of the sensitive images).
* :mod:`~fastdpot.experiments.dpswgen`, :mod:`~fastdpot.experiments.dp_sinkhorn`, :mod:`~fastdpot.experiments.ldp` —
  the generator models, evaluations and command lines of the other methods (``python -m
  fastdpot.experiments.dp_sinkhorn``, ``python -m fastdpot.experiments.ldp``).
"""
