"""fastdpot: compiled kernels for differentially private optimal transport in PyTorch."""
__version__ = "0.1.0"

from ._dispatch import available_backends, dispatch  # noqa: F401
from ._ext import BackendUnavailableError  # noqa: F401
from ._random import draw_seed, make_generator  # noqa: F401

# Public API (each module registers its ops with the dispatch table on import).
from .sliced import (DPSlicedWassersteinLoss, SlicedWassersteinLoss, dp_sliced_wasserstein,  # noqa: F401,E402
                     dp_sliced_wasserstein_noise_std, sliced_wasserstein)
from .flow import ClassConditionalFlow, DPSlicedWassersteinFlow, NonFiniteParticlesError  # noqa: F401,E402
from . import privacy  # noqa: F401,E402  the privacy core (accounting, budgets, samplers, mechanisms)
from .privacy import (BudgetExceededError, FixedSizeSampler, PoissonSampler, PrivacyAccountant,  # noqa: F401,E402
                      PrivacyBudget, calibrate_noise_multiplier, sliced_sensitivity)
# op "sinkhorn" (fastdpot.ops.sinkhorn: keops, reference); its function stays fastdpot.sinkhorn.sinkhorn
# (re-exported there), not imported here, so the submodule fastdpot.sinkhorn is not shadowed
from .sinkhorn import SinkhornLoss, entropic_wasserstein, semi_debiased_sinkhorn_loss  # noqa: F401,E402

# The main job (`fastdpot flow`: data loaders, auto-encoders, metrics, pipeline, CLI; the package fastdpot.mainjob)
# is not imported with the package: it is loaded on first use, so `import fastdpot` costs only the library (PEP 562
# module __getattr__). fastdpot.data, .metrics, .pipeline, .autoencoder and .cli are its old import paths (thin
# modules that re-export fastdpot.mainjob's).
_LAZY = {"mainjob": (".mainjob", None), "data": (".data", None), "metrics": (".metrics", None),
         "pipeline": (".pipeline", None), "autoencoder": (".autoencoder", None), "cli": (".cli", None),
         "PipelineConfig": (".mainjob.config", "PipelineConfig"),
         "run_pipeline": (".mainjob.pipeline", "run_pipeline")}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module, __name__)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'fastdpot' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
