"""The ops: one module per op, each the single home of its validated public entry point and its backends.

An op module owns

* the public function (argument checks, then dispatch),
* the dispatch rows (:mod:`fastdpot._dispatch`): the ``reference`` (pure torch, :mod:`fastdpot.reference`) and ``cpu``
  (C++/OpenMP extension) implementations, the ``auto`` rules, and the optional features each row implements,
* the registration of its Triton launcher, which stays under the top-level ``kernels/`` package
  (:func:`fastdpot.ops._triton.register_triton`: imported on first use, so ``import fastdpot`` does not import Triton).

The modules: :mod:`fastdpot.ops.flow` (op ``flow_step``, exported here: :func:`flow_step` is the op's function,
with its :class:`Shard`), :mod:`fastdpot.ops.sliced_wasserstein` (op ``"sliced_wasserstein"``, entry point
``sliced_wasserstein_op``), :mod:`fastdpot.ops.sinkhorn` (op ``"sinkhorn"``) and :mod:`fastdpot.ops.cpu_histogram`
(the histogram step's C++ passes); :mod:`fastdpot.ops.library` registers them as PyTorch custom ops
(``torch.ops.fastdpot.sliced_wasserstein``, ``clip_rows``, ``privacy_draws``, ``flow_step``: what a
``torch.compile``d function calls).

Everything else (the classes, the main job, ``bench/``) calls the op's public function, with ``backend=`` to pick an
implementation.
"""
from .flow import QUANTILE_MODES, Shard, flow_step, step_draws, step_needs
from . import library  # noqa: E402,F401  registers torch.ops.fastdpot.* (the ops as PyTorch custom ops)

__all__ = ["flow_step", "Shard", "QUANTILE_MODES", "step_draws", "step_needs"]
