"""Game configs, whatever the family: which games there are, a game's config as Hydra composes
it, and its ``structured_output`` setting.

What a config means is its family's business (:mod:`aria.games.family`): question games are built
in :mod:`aria.games.question.game`, two-player games in :mod:`aria.games.two_player.glee`.
"""
from __future__ import annotations

from typing import Any, Mapping

import yaml
from omegaconf import OmegaConf

from aria.io import ConfigError, DataError
from aria.resources import config_dir


def known_games() -> list[str]:
    """Names of the games with a config in ``config/game/``."""
    return sorted(p.stem for p in (config_dir() / "game").glob("*.yaml"))


def load_game_config(name: str, _within: tuple[str, ...] = ()) -> dict:
    """The config mapping of ``config/game/<name>.yaml`` (what Hydra's ``game=<name>`` selects).

    A game config may start from others of its group, as Hydra composes it (``defaults:
    [twenty_questions, _self_]``): the bases are merged first, then the file's own keys.
    """
    path = config_dir() / "game" / f"{name}.yaml"
    if not path.is_file():
        raise DataError(path, None, None, f"no config for game {name!r} (known: {', '.join(known_games())})")
    if name in _within:
        raise DataError(path, None, "defaults", f"starts from itself: {' -> '.join((*_within, name))}")
    own = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(own, dict):
        raise DataError(path, None, None, "expected a mapping of settings")
    defaults = own.pop("defaults", [])
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise DataError(path, None, "defaults", "expected a list of game config names")
    bases = [load_game_config(base, (*_within, name)) for base in defaults if base != "_self_"]
    if not bases:
        return own
    return OmegaConf.to_container(OmegaConf.merge(*bases, own))


#: ``structured_output`` values of a game config, per kind of game: free replies, a question game's
#: one-line question format (``reply_regex``, e.g. ``Question: ...?``), or a two-player reply
#: under the JSON schema of its turn (:func:`aria.games.two_player.offers.reply_schema`).
STRUCTURED_OUTPUTS = {"question": ("none", "regex"), "two_player": ("none", "json_schema")}


def structured_output(game_cfg: Mapping[str, Any], kind: str) -> str:
    """The game's ``structured_output`` setting (default ``none``), checked against what its
    family (``kind``: ``question`` or ``two_player``) allows."""
    allowed = STRUCTURED_OUTPUTS[kind]
    value = game_cfg.get("structured_output") or "none"
    if value not in allowed:
        raise ConfigError(f"{game_cfg['name']}: structured_output must be one of {allowed}, got {value!r}")
    if value == "regex" and not game_cfg.get("reply_regex"):
        raise ConfigError(f"{game_cfg['name']}: structured_output: regex needs reply_regex in the game config")
    return value
