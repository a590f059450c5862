"""The main job, ``fastdpot flow``: private image generation with a DP sliced-Wasserstein flow in an
auto-encoder's latent space (docs/mainjob.md). It uses the library (:mod:`fastdpot.flow`, :mod:`fastdpot.privacy`,
...); the library never imports it, and ``import fastdpot`` does not load it.

Modules, in the order a run uses them:

* :mod:`~fastdpot.mainjob.cli` — the ``fastdpot flow`` command line (``python -m fastdpot flow``, also under
  ``torchrun -m fastdpot flow --distributed``).
* :mod:`~fastdpot.mainjob.config` — :class:`~fastdpot.mainjob.config.PipelineConfig`, the settings of one run.
* :mod:`~fastdpot.mainjob.pipeline` — :func:`~fastdpot.mainjob.pipeline.run_pipeline`, which chains the stages and
  writes the run folder; every stage function can be imported from it.
* :mod:`~fastdpot.mainjob.data` — image loaders (IDX, Fashion-MNIST from the Debian package, CelebA folders,
  scikit-learn fallbacks) and the seeded public/private split.
* :mod:`~fastdpot.mainjob.autoencoder` — the auto-encoders trained on the public half, and their cache.
* :mod:`~fastdpot.mainjob.stages` — the public stages: data, auto-encoder, spread calibration, decoding, metrics.
* :mod:`~fastdpot.mainjob.flow_stage` — the private stage: the DP flow on the private latents.
* :mod:`~fastdpot.mainjob.distributed_stage` — that flow stage sharded over torchrun's ranks (``--distributed``).
* :mod:`~fastdpot.mainjob.baselines` — the DP Gaussian per class and public-only baselines (``--method``).
* :mod:`~fastdpot.mainjob.metrics` — FID and downstream classifiers (LogReg, MLP, CNN).
* :mod:`~fastdpot.mainjob.report` — ``samples.png``, ``metrics.json``, ``privacy.md``.
* :mod:`~fastdpot.mainjob.tuning` — the public-only hyper-parameter sweep (``python -m fastdpot.tuning``).

The old module names (``fastdpot.pipeline``, ``fastdpot.data``, ``fastdpot.metrics``, ``fastdpot.autoencoder``,
``fastdpot.cli``, ``fastdpot.baselines``, ``fastdpot.tuning``) are kept as thin modules that re-export these.
"""
