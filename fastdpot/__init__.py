"""fastdpot: compiled kernels for differentially private optimal transport in PyTorch."""
__version__ = "0.1.0"

from ._dispatch import available_backends, dispatch  # noqa: F401
from ._ext import BackendUnavailableError  # noqa: F401
from ._random import draw_seed, make_generator  # noqa: F401

# Public API (each module registers its ops with the dispatch table on import).
from .sliced import (DPSlicedWassersteinLoss, SlicedWassersteinLoss, dp_sliced_wasserstein,  # noqa: F401,E402
                     dp_sliced_wasserstein_noise_std, sliced_wasserstein)
from . import kernels as _kernels  # noqa: F401,E402  registers the triton backends (flow_step, sliced_wasserstein)
from .flow import ClassConditionalFlow, DPSlicedWassersteinFlow, NonFiniteParticlesError  # noqa: F401,E402
from . import privacy  # noqa: F401,E402  the privacy core (accounting, budgets, samplers, mechanisms)
from .privacy import (BudgetExceededError, FixedSizeSampler, PoissonSampler, PrivacyAccountant,  # noqa: F401,E402
                      PrivacyBudget, calibrate_noise_multiplier, sliced_sensitivity)
# op "sinkhorn" (keops, reference); the function stays fastdpot.sinkhorn.sinkhorn so the submodule is not shadowed
from .sinkhorn import SinkhornLoss, entropic_wasserstein, semi_debiased_sinkhorn_loss  # noqa: F401,E402
# the main job (fastdpot flow): data loaders, auto-encoders, metrics, pipeline
from . import data, metrics  # noqa: F401,E402
from .pipeline import PipelineConfig, run_pipeline  # noqa: F401,E402
