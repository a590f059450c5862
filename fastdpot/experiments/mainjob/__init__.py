"""The main job: private image generation, one pipeline for two protocols (``fastdpot flow``).

Modules, in the order a run uses them (each imports only those before it, and the library):

* :mod:`~fastdpot.experiments.mainjob.config` — :class:`MainJobConfig`, frozen and nested (one dataclass per stage),
  the one parser of settings, and its defaults and checks (:func:`~fastdpot.experiments.mainjob.config.resolve`);
* :mod:`~fastdpot.experiments.mainjob.protocols` — the public-half and private-only protocols: data, split, code
  space (with :mod:`~fastdpot.experiments.mainjob.autoencoder`, the public auto-encoders, and
  :mod:`~fastdpot.experiments.mainjob.representation`, the DP representations);
* :mod:`~fastdpot.experiments.mainjob.generation` — the generator on the private codes (flow, baselines), with
  :mod:`~fastdpot.experiments.mainjob.codes` (the public-half code space's post-processing) and
  :mod:`~fastdpot.experiments.mainjob.distributed` (``--distributed``);
* :mod:`~fastdpot.experiments.mainjob.evaluation` — FID, downstream accuracy, label fidelity;
* :mod:`~fastdpot.experiments.mainjob.report` and :mod:`~fastdpot.experiments.mainjob.privacy_report` — the run
  folder's outputs;
* :mod:`~fastdpot.experiments.mainjob.pipeline` — :func:`run_pipeline`, the one driver;
* :mod:`~fastdpot.experiments.mainjob.tuning` — the one tuning harness (``python -m
  fastdpot.experiments.mainjob.tuning``); :mod:`~fastdpot.experiments.mainjob.cli` — ``fastdpot flow``.
"""
from .config import MainJobConfig, parse_settings, setting_names

__all__ = ["MainJobConfig", "run_pipeline", "parse_settings", "setting_names"]


def __getattr__(name):
    # run_pipeline on first use (PEP 562): importing the package does not import the pipeline's modules, so that
    # ``python -m fastdpot.experiments.mainjob.report`` runs its module once, not after an import of it
    if name == "run_pipeline":
        from .pipeline import run_pipeline

        return run_pipeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
