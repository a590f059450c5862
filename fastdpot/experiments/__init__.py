"""The main job, ``fastdpot flow``: private image generation with a DP sliced-Wasserstein flow in an
auto-encoder's latent space (docs/mainjob.md). It uses the library (:mod:`fastdpot.flows`, :mod:`fastdpot.privacy`,
...); the library never imports it, and ``import fastdpot`` does not load it.

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
* :mod:`~fastdpot.experiments.tuning` — the public-only hyper-parameter sweep (``python -m fastdpot.tuning``).

The old module names (``fastdpot.pipeline``, ``fastdpot.data``, ``fastdpot.metrics``, ``fastdpot.autoencoder``,
``fastdpot.cli``, ``fastdpot.baselines``, ``fastdpot.tuning``) are kept as thin modules that re-export these.
"""
