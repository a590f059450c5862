"""Privacy core of fastdpot: sensitivities, mechanisms, accounting, budgets and samplers.

See the README section "Privacy" for which mechanism uses which neighbouring relation and accountant, and how each
method splits δ. Accounting is delegated to Google's dp-accounting (PLD and RDP).
"""
from .._random import make_generator
from .accounting import ACCOUNTANTS, SAMPLINGS, PrivacyAccountant, calibrate_noise_multiplier
from .budget import BudgetExceededError, PrivacyBudget
from .class_sketch import ClassSketchRelease, class_quantile_sketch, release_class_sketch
from .ledger import PrivacyLedger
from .mechanisms import (clip_rows, gaussian_local_mechanism, gaussian_mechanism_sigma,
                         gaussian_projection_mechanism, laplace_local_mechanism, ldp_gaussian_sigma,
                         normalize_rows, project_l1_ball)
from .randomness import PrivacyRandomness
from .sampling import FixedSizeSampler, PoissonSampler
from .sketch import QuantileSketch, bin_levels, bin_sizes, sliced_quantile_sketch
from .sensitivity import (CLT_MIN_PROJECTIONS, orthogonal_sliced_sensitivity, projection_mechanism_epsilon,
                          sliced_sensitivity, sliced_sensitivity_sq, split_delta)

__all__ = [
    "make_generator",
    "PrivacyAccountant", "calibrate_noise_multiplier", "ACCOUNTANTS", "DEFAULT_ORDERS", "SAMPLINGS",
    "PrivacyBudget", "BudgetExceededError", "PrivacyLedger",
    "clip_rows", "normalize_rows", "project_l1_ball", "gaussian_mechanism_sigma", "ldp_gaussian_sigma",
    "gaussian_projection_mechanism", "laplace_local_mechanism", "gaussian_local_mechanism",
    "PoissonSampler", "FixedSizeSampler", "PrivacyRandomness",
    "sliced_quantile_sketch", "QuantileSketch", "bin_sizes", "bin_levels",
    "class_quantile_sketch", "release_class_sketch", "ClassSketchRelease",
    "sliced_sensitivity", "sliced_sensitivity_sq", "orthogonal_sliced_sensitivity", "split_delta", "projection_mechanism_epsilon",
    "CLT_MIN_PROJECTIONS",
]


def __getattr__(name):  # PEP 562: DEFAULT_ORDERS is built from dp-accounting's list, imported on first use
    if name == "DEFAULT_ORDERS":
        from . import accounting
        return accounting.DEFAULT_ORDERS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
