"""Old import path of :mod:`fastdpot.mainjob.baselines`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.baselines`` and ``from fastdpot.baselines import ...``
keep working.
"""
from .mainjob.baselines import (baseline_privacy_md, dp_class_gaussians, moments_sensitivity,  # noqa: F401
                                particles_per_class, public_only_samples, sample_class_gaussians, stage_baseline)

__all__ = ["moments_sensitivity", "dp_class_gaussians", "sample_class_gaussians", "public_only_samples",
           "particles_per_class"]
