"""The ops: one module per op, each the single home of its validated public entry point and its backends.

An op module owns

* the public function (argument checks, then dispatch),
* the dispatch rows (:mod:`fastdpot._dispatch`): the ``reference`` (pure torch, :mod:`fastdpot.reference`) and ``cpu``
  (C++/OpenMP extension) implementations, the ``auto`` rules,
* the registration of its Triton launcher, which stays under the top-level ``kernels/`` package
  (:func:`fastdpot.ops._triton.register_triton`: imported on first use, so ``import fastdpot`` does not import Triton).

Everything else (the classes, the main job, ``bench/``) calls the op's public function, with ``backend=`` to pick an
implementation.
"""
