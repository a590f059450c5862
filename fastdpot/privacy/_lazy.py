"""A module imported on first attribute access (for dp-accounting, which costs about 1.2 s to import)."""
from __future__ import annotations

import importlib


class LazyModule:
    """Stands for module ``name``; the first attribute access imports it (``importlib.import_module``)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self):
        return f"<lazily imported module {self._name!r}>"
