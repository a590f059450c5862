"""Old import path of :mod:`fastdpot.mainjob.autoencoder`, where the code lives (the main job is
``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.autoencoder`` and ``from fastdpot.autoencoder import ...``
keep working.
"""
from .mainjob.autoencoder import (AutoEncoderConfig, ConvAutoEncoder, DCGANAutoEncoder, build_autoencoder,  # noqa: F401
                                  data_hash, decode, default_cache_dir, encode, train_autoencoder)

__all__ = ["ConvAutoEncoder", "DCGANAutoEncoder", "AutoEncoderConfig", "build_autoencoder", "train_autoencoder",
           "encode", "decode", "default_cache_dir", "data_hash"]
