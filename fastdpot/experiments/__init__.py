"""The applications built on the library, in two sibling packages over shared data and metrics:

* :mod:`fastdpot.experiments.mainjob` — the main job ``fastdpot flow``: private image generation, one pipeline for
  the public-half protocol (docs/mainjob.md) and the private-only protocol (``--public-size 0``,
  docs/mainjob-private.md);
* :mod:`fastdpot.experiments.papers` — the experiments of the other methods (DPSWgen, DP-Sinkhorn, LDP);
* :mod:`fastdpot.experiments.data` — image loaders (IDX, Fashion-MNIST from the Debian package, CelebA folders,
  scikit-learn fallbacks) and the seeded splits; :mod:`fastdpot.experiments.metrics` — FID and downstream
  classifiers.

They use the library (:mod:`fastdpot.flows`, :mod:`fastdpot.privacy`, ...); the library never imports them,
``import fastdpot`` does not load them, and no module here draws privacy noise itself: every mechanism is the
library's.
"""
