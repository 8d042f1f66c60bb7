"""Module attributes that import their module on first use (PEP 562), so `import kvlab` stays light."""
from __future__ import annotations

import importlib


def lazy_getattr(owner: str, table: dict[str, str]):
    """A module `__getattr__` that returns `table[name]`'s attribute `name`, importing that module on first use."""
    def __getattr__(name):
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    return __getattr__
