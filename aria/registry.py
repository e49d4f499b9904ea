"""Lazy registries: a registry maps a name to ``"module:attribute"``, imported only when used, so
that registering a class never imports its module (and no import cycle can start there)."""
from __future__ import annotations

import importlib
from typing import Any


def load_object(path: str) -> Any:
    """The attribute named by ``"package.module:attribute"``."""
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attribute)
