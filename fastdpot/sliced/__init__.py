"""(DP) sliced Wasserstein losses — Rakotomamonjy & Ralaivola, ICML 2021.

Public API: :func:`sliced_wasserstein` (POT's conventions), :func:`dp_sliced_wasserstein`,
:class:`SlicedWassersteinLoss`, :class:`DPSlicedWassersteinLoss`, :func:`dp_sliced_wasserstein_noise_std`.
Under ``torch.compile`` the functions are PyTorch custom ops (:mod:`fastdpot.sliced._compiled`,
:mod:`fastdpot.ops.library`).

The losses add their conventions (POT's positional order, argument aliases and numpy in and out, the privacy
randomness, clipping, the release kinds, the calibration, the modules and their state) to op
``"sliced_wasserstein"``, whose entry point, checks and backends (reference, cpu, triton, cuda) live in
:mod:`fastdpot.ops.sliced_wasserstein`. Functions in :mod:`.functional`, modules and calibration in
:mod:`.modules`.
"""
from __future__ import annotations

# kept importable from here (kernels/, tests, users): the op's direction sampler
from .._random import random_projections
from ..ops.sliced_wasserstein import _DTYPES  # noqa: F401
from .functional import (DEFAULT_NUM_PROJECTIONS, DIRECTIONS, RELEASES, _private_generated,  # noqa: F401
                         _seed_generator, check_release, dp_sliced_wasserstein, sliced_wasserstein)
from .modules import DPSlicedWassersteinLoss, SlicedWassersteinLoss, dp_sliced_wasserstein_noise_std

__all__ = ["sliced_wasserstein", "dp_sliced_wasserstein", "SlicedWassersteinLoss", "DPSlicedWassersteinLoss",
           "dp_sliced_wasserstein_noise_std", "random_projections", "DEFAULT_NUM_PROJECTIONS"]
