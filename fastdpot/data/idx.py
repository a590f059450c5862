"""Old import path of :mod:`fastdpot.mainjob.data.idx`, where the code lives (the main job is
``fastdpot/mainjob/``); only re-exports the public names."""
from ..mainjob.data.idx import find_idx_file, load_idx_split, read_idx  # noqa: F401

__all__ = ["read_idx", "find_idx_file", "load_idx_split"]
