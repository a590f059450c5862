"""Old import path of :mod:`fastdpot.mainjob.cli`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.cli`` and ``from fastdpot.cli import ...`` keep working.
"""
from .mainjob.cli import build_parser, main  # noqa: F401

__all__ = ["build_parser", "main"]
