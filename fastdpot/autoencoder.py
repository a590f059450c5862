"""Old import path of :mod:`fastdpot.mainjob.autoencoder`, where the code lives (the main job is
``fastdpot/mainjob/``).

Only re-exports the public names (the new module's ``__all__``), so that ``import fastdpot.autoencoder`` and
``from fastdpot.autoencoder import ...`` keep working.
"""
from .mainjob.autoencoder import *  # noqa: F401,F403
from .mainjob.autoencoder import __all__  # noqa: F401
