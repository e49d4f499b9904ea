"""Typed settings: how a config is checked once where it enters.

Each command's config (a Hydra composition of ``config/<name>.yaml``, or a dict a caller builds)
is checked against its schema before any work: a key the schema does not know, a value of the
wrong type, a value outside the range its field declares (:func:`bounded`) or a mandatory value
left as ``???`` is one :class:`~aria.io.ConfigError` naming the setting. :func:`typed` gives back
an instance of the schema, read as attributes (``cfg.aggregation.gamma``) by the code that owns
it; :func:`validated` a plain dict with the declared types, for the commands still read by key
(``1`` becomes ``1.0`` for a float, ``"3"`` becomes ``3`` for an int). A schema lives beside the
code that reads it (:mod:`aria.intention.settings`, :mod:`aria.trainers.settings`,
:mod:`aria.games.common.settings`, :mod:`aria.experiment.settings`); ``aria.resources.SCHEMAS`` names
each config's.

Where the defaults live: the YAML files hold every value and its explanation, so a field that
the YAML always sets is ``MISSING`` here (no second default to drift from the first). A field
carries a default here only where the shipped YAML leaves it out on purpose, as an option most
runs never set.

Choices that come from a registry (``method``, ``loss.name``, ``train.packing``, a scheduler
name) stay strings: the registry checks them and lists the known names. A game section has the
schema of its family (:mod:`aria.games.common.settings`), checked by ``aria.games.family.checked_game``
where a command takes its game. Policy, oracle, opponent and embedder sections are config groups
whose options differ in shape; the registries that build them check them against their classes'
parameters (``aria.registry.check_options``).
"""
from __future__ import annotations

import math
from pathlib import PurePath
from dataclasses import field, fields, is_dataclass
from typing import Any, Mapping, get_args, get_origin, get_type_hints

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aria.io import ConfigError

#: The most games one setting plays: a command holds its whole schedule in memory (10**12 games
#: ran out of it before the first game), and a million games is already some GB of transcripts;
#: more are several runs into other files, with other seeds.
MAX_GAMES = 1_000_000


class Required(ValueError):
    """A value a preset leaves to the command line (``${required:setting,example}``)."""


def _required(setting: str, example: str = "...") -> Any:
    raise Required(f"no value given (this preset needs one): set it on the command line, e.g. {setting}={example}")


# A preset cannot leave a value as ``???`` over one its defaults set (OmegaConf keeps the earlier
# value: experiment=paper_single would train the embedded model); ``${required:...}`` refuses
# instead, when the config is resolved (:func:`validated`).
OmegaConf.register_new_resolver("required", _required, replace=True)


def data_name(train_file: str) -> str:
    """What a training file is called in its run's default output folder: its folder's name for a
    pipeline file called ``train.json`` (``outputs/intention/twenty_questions/train.json`` ->
    ``twenty_questions``), else its own name without the suffix (``data/my_games.json`` -> ``my_games``)."""
    path = PurePath(str(train_file))
    return (path.parent.name if path.stem == "train" and path.parent.name else path.stem) or "data"


# Default output folders are named by what made them (``outputs/offline/cpu/aria/twenty_questions``),
# so that two methods or two collections trained one after the other never share a ``final/``.
OmegaConf.register_new_resolver("data_name", data_name, replace=True)


def bounded(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            one_of: tuple | None = None, nonempty: bool = False, each: Mapping[str, float] | None = None,
            length: int | None = None, why: str | None = None, default: Any = MISSING) -> Any:
    """A field whose value must also lie in a range (``ge`` <= v, ``gt`` < v, v <= ``le``,
    v < ``lt``, finite), be ``one_of`` some names, be a ``nonempty`` list, a list of ``length``
    elements, or a list whose ``each`` element obeys the rules given there (``{"ge": 0}``): what a type cannot say, checked
    by :func:`validated` with the types, so a value that would train anyway, play the wrong seat
    or fail after the model loaded is one line before any work. ``null`` passes where the field is ``Optional``; ``why`` is said with the
    refusal (what a boundary value means: "0: no clipping")."""
    rules = {name: value for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("one_of", one_of),
                                             ("nonempty", nonempty or None), ("length", length), ("each", each),
                                             ("why", why)) if value is not None}
    return field(default=default, metadata={"bounds": rules})


def out_of_bounds(value: Any, rules: Mapping[str, Any]) -> str | None:
    """What ``value`` should have been under ``rules``, or None where it is fine."""
    if "one_of" in rules:
        return None if value in rules["one_of"] else f"one of {', '.join('null' if v is None else str(v) for v in rules['one_of'])}"
    if "nonempty" in rules and not value:
        return "a non-empty path" if isinstance(value, str) else "a non-empty list"
    if "length" in rules and len(value) != rules["length"]:
        return f"a list of {rules['length']} numbers"
    if "each" in rules:
        wanted = [out_of_bounds(v, rules["each"]) for v in value]
        return next((f"a list whose every element is {w}" for w in wanted if w), None)
    def shown(bound: float) -> str:  # 1000000, not 1e+06
        return f"{bound:,}".replace(",", "_") if isinstance(bound, int) and abs(bound) >= 10_000 else f"{bound:g}"

    limits = [f">= {shown(rules['ge'])}" if "ge" in rules else None, f"> {shown(rules['gt'])}" if "gt" in rules else None,
              f"<= {shown(rules['le'])}" if "le" in rules else None, f"< {shown(rules['lt'])}" if "lt" in rules else None]
    text = " and ".join(limit for limit in limits if limit)
    if not text:
        return None
    fine = (math.isfinite(value) and ("ge" not in rules or value >= rules["ge"]) and ("gt" not in rules or value > rules["gt"])
            and ("le" not in rules or value <= rules["le"]) and ("lt" not in rules or value < rules["lt"]))
    return None if fine else f"{'an integer' if isinstance(value, int) else 'a finite number'} {text}"


def _check_bounds(schema: type, values: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first field of ``values`` (typed by ``schema``) out of its bounds, as "key: expected ..., got ..."."""
    hints = get_type_hints(schema)
    for f in fields(schema):
        value, key = values.get(f.name), prefix + f.name
        rules = f.metadata.get("bounds")
        if rules and value is not None and (wanted := out_of_bounds(value, rules)):
            meaning = f" ({rules['why']})" if "why" in rules else ""
            return f"{key}: expected {wanted}{meaning}, got {value!r}"
        hint = hints[f.name]
        if is_dataclass(hint) and isinstance(value, Mapping):
            if problem := _check_bounds(hint, value, key + "."):
                return problem
        elif get_origin(hint) is dict and is_dataclass(get_args(hint)[1]) and isinstance(value, Mapping):
            for name, item in value.items():
                if problem := _check_bounds(get_args(hint)[1], item, f"{key}.{name}."):
                    return problem
    return None


def validated(schema: type, cfg: Mapping | Any, where: str = "") -> dict:
    """``cfg`` (a dict, an OmegaConf config or a ``schema`` instance, interpolations resolved or
    not) checked against ``schema``, as a plain dict with the declared types; a problem is one
    :class:`ConfigError` naming the setting (and ``where`` the settings came from, when given)."""
    return _checked(schema, cfg, where)[1]


def typed(schema: type, cfg: Mapping | Any, where: str = ""):
    """``cfg`` checked as :func:`validated` checks it, as an instance of ``schema`` (its sections
    instances of theirs; a field typed ``Any`` keeps a plain dict or list): what the code that owns
    a schema reads as attributes."""
    return OmegaConf.to_object(_checked(schema, cfg, where)[0])


def _checked(schema: type, cfg: Mapping | Any, where: str) -> tuple[Any, dict]:
    """(the merged OmegaConf config, its values as a plain dict), types and bounds checked."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        values = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err, where)) from None
    if problem := _check_bounds(schema, values):
        raise ConfigError(f"{where + ': ' if where else ''}{problem}")
    return merged, values


def resolved(cfg: Any) -> dict:
    """A Hydra config as a plain dict, its interpolations resolved (``${required:...}`` too), for
    the trainers' launch modules, which hand it to a trainer that validates it; a value that
    cannot be resolved is one :class:`ConfigError` naming the setting."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err, "")) from None


def _one_line(err: OmegaConfBaseException, where: str) -> str:
    key = getattr(err, "full_key", None)  # none for a value merged whole (a section given as a string)
    message = str(getattr(err, "msg", None) or err).strip().splitlines()[0]
    if type(err).__name__ == "MissingMandatoryValue":
        message = "no value given (the config leaves it as ???): set it on the command line, e.g. " \
                  f"{key}=..."
    elif type(err).__name__ == "ConfigKeyError":
        message = f"not a setting of this command ({message})"
    elif "no value given (this preset needs one)" in message:  # a ${required:...} left unset
        message = message[message.index("no value given"):]
    return ": ".join(part for part in (where, key, message) if part)

