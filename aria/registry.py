"""Lazy registries: a registry maps a name to ``"module:attribute"``, imported only when used, so
that registering a class never imports its module (and no import cycle can start there)."""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from aria.io import ConfigError
from aria.secrets import is_secret_key
from aria.settings import out_of_bounds
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch


def load_object(path: str) -> Any:
    """The attribute named by ``"package.module:attribute"``."""
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attribute)


#: The ranges of options that registered classes of several kinds take, by name: their config
#: sections (policy, opponent, embedder) are groups of different shapes, with no one schema in
#: aria.settings, so their options are checked by name.
OPTION_BOUNDS: dict[str, dict[str, float]] = {
    "temperature": {"ge": 0}, "top_p": {"gt": 0, "le": 1}, "timeout_s": {"gt": 0}, "retry_base_delay_s": {"ge": 0},
    "epsilon": {"ge": 0, "le": 1}, "strength": {"ge": 0, "le": 1},
    # whole numbers (WHOLE_OPTIONS)
    "max_tokens": {"ge": 1}, "max_new_tokens": {"ge": 1}, "max_prompt_tokens": {"ge": 1}, "concurrency": {"ge": 1},
    "max_retries": {"ge": 0}, "batch_size": {"ge": 1}, "dimensions": {"ge": 1},
}
WHOLE_OPTIONS = ("max_tokens", "max_new_tokens", "max_prompt_tokens", "concurrency", "max_retries", "batch_size",
                 "dimensions")


def check_options(cls: type, options: Mapping[str, Any], setting: str, what: str) -> None:
    """``options`` for ``cls(**options)``, checked before it is built (before a model loads): a key
    its constructor does not take, a value out of :data:`OPTION_BOUNDS`, or a ``device`` torch
    does not know is a ``ConfigError`` naming ``setting.key`` (``what``: "the local policy")."""
    parameters = inspect.signature(cls).parameters.values()
    open_ended = any(p.kind is p.VAR_KEYWORD for p in parameters)  # takes any key: only the ranges are checked
    known = [p.name for p in parameters if p.name not in ("self", "name") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for key, value in options.items():
        if key not in known and not open_ended:
            raise ConfigError(f"{setting}.{key}: not an option of {what} (known: {', '.join(known) or 'none'})")
        if is_secret_key(key) and value is not None and not isinstance(value, str):  # named, never echoed; here,
            # not where the client is built (an online run's labelling, an iteration in)
            raise ConfigError(f"{setting}.{key}: expected a string (the key itself), got a {type(value).__name__}: "
                              "give the key as a plain value, or in $OPENAI_API_KEY")
        if wanted := _option_problem(key, value):
            raise ConfigError(f"{setting}.{key}: expected {wanted}, got {value!r}")


def _option_problem(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if key == "device":
        import torch

        try:
            torch.device(value)
        except (RuntimeError, TypeError):
            return "a torch device (cpu, cuda, cuda:1)"
        return None
    if key not in OPTION_BOUNDS:
        return None
    whole = key in WHOLE_OPTIONS
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return "an integer" if whole else "a number"
    return out_of_bounds(value if whole else float(value), OPTION_BOUNDS[key])
