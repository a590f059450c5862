"""Old import path of :mod:`fastdpot.mainjob.metrics`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.metrics`` and ``from fastdpot.metrics import ...`` keep
working.
"""
from .mainjob.metrics import (CLASSIFIERS, cnn_accuracy, downstream_accuracy, feature_statistics, fid,  # noqa: F401
                              frechet_distance, inception_features, real_statistics)

__all__ = ["fid", "inception_features", "feature_statistics", "real_statistics", "frechet_distance",
           "downstream_accuracy", "cnn_accuracy", "CLASSIFIERS"]
