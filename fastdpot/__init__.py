"""fastdpot: compiled kernels for differentially private optimal transport in PyTorch.

The public API (``fastdpot.__all__``): the DP sliced-Wasserstein losses, the DP sliced-Wasserstein flows, the
Sinkhorn losses, the privacy core's accountant, budget, calibration and samplers, and the backends' status. The
subpackages hold the rest: :mod:`fastdpot.flows`, :mod:`fastdpot.privacy`, :mod:`fastdpot.ops` (the ops and their
backends), :mod:`fastdpot.reference` (the pure-torch references), :mod:`fastdpot.audit`, and the applications built
on the library, :mod:`fastdpot.experiments` (``fastdpot flow``; not imported with the package).
"""
__version__ = "0.1.0"

from ._dispatch import available_backends
from ._ext import BackendUnavailableError
from ._random import draw_seed, make_generator

# Public API (each module registers its ops with the dispatch table on import).
from .sliced import (DPSlicedWassersteinLoss, SlicedWassersteinLoss, dp_sliced_wasserstein,  # noqa: E402
                     dp_sliced_wasserstein_noise_std, sliced_wasserstein)
from .flows import (ClassConditionalFlow, DistributedSlicedWassersteinFlow, DPSlicedWassersteinFlow,  # noqa: E402
                    FlowConfig, NonFiniteParticlesError, make_flow)
from . import privacy  # noqa: E402  the privacy core (accounting, budgets, samplers, mechanisms)
from .privacy import (BudgetExceededError, FixedSizeSampler, PoissonSampler, PrivacyAccountant,  # noqa: E402
                      PrivacyBudget, calibrate_noise_multiplier, sliced_sensitivity)
from .sinkhorn import SinkhornLoss, entropic_wasserstein, semi_debiased_sinkhorn_loss  # noqa: E402

__all__ = [
    "__version__",
    "dp_sliced_wasserstein", "dp_sliced_wasserstein_noise_std", "sliced_wasserstein", "DPSlicedWassersteinLoss",
    "SlicedWassersteinLoss",
    "DPSlicedWassersteinFlow", "ClassConditionalFlow", "DistributedSlicedWassersteinFlow", "make_flow", "FlowConfig",
    "NonFiniteParticlesError",
    "SinkhornLoss", "entropic_wasserstein", "semi_debiased_sinkhorn_loss",
    "privacy", "PrivacyAccountant", "PrivacyBudget", "BudgetExceededError", "calibrate_noise_multiplier",
    "sliced_sensitivity", "FixedSizeSampler", "PoissonSampler",
    "make_generator", "draw_seed", "available_backends", "BackendUnavailableError",
]
