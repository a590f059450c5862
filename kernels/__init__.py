"""Triton GPU kernels (shipped as the subpackage ``fastdpot.kernels``; on CPU they run under ``TRITON_INTERPRET=1``).

The launchers are registered by their op modules (:func:`fastdpot.ops._triton.register_triton`): op ``"flow_step"``
uses ``flow_step.flow_step_triton`` and op ``"sliced_wasserstein"`` uses ``dpswd.sliced_wasserstein_triton``. They are
imported the first time the ``triton`` backend is dispatched to, so ``import fastdpot`` does not import Triton. The
kernels import nothing from the op modules (what a launcher shares with its op lives below both, e.g.
:mod:`fastdpot.ops._sliced_shared`), so the op modules' lazy import of a launcher closes no loop.
"""
from fastdpot._triton_status import triton_available  # noqa: F401  (kept importable from here)
