"""Old import path of :mod:`fastdpot.mainjob.tuning`, where the code lives (the main job is ``fastdpot/mainjob/``).

Only re-exports the public names, so that ``import fastdpot.tuning`` and ``from fastdpot.tuning import ...`` keep
working, and runs the tuning grid as ``python -m fastdpot.tuning`` (the documented command).
"""
from .mainjob.tuning import build_parser, main, parse_grid, parse_settings, run_tuning, tuning_split  # noqa: F401

__all__ = ["tuning_split", "parse_grid", "parse_settings", "run_tuning", "main"]

if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
