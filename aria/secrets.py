"""Keeping secrets out of files and logs.

A resolved config can hold an API key: ``policy.api_key: ${oc.env:OPENAI_API_KEY,EMPTY}`` becomes
the key itself, and a user may pass ``oracle.api_key=sk-...`` on the command line. Every file this
project writes through :mod:`aria.io` (configs, summaries, reports, checkpoints' state,
trajectories) and every hyper-parameter it logs goes through :func:`redact` or
:func:`redact_text`, so neither a model folder nor a results folder carries one.

Three rules:

* **By name.** The value of a key named like a secret (``api_key``, ``apikey``, ``token``,
  ``access_token``, ``secret``, ``password``, ``authorization``, also with a prefix such as
  ``hf_token``; plurals such as ``max_new_tokens`` and tokenizer fields such as ``pad_token``
  are not secrets) becomes ``"<redacted>"``,
  except the placeholders ``None``, ``""`` and ``"EMPTY"`` (what vLLM accepts).
* **By value.** Any string that contains the value of an environment variable named like a
  secret (``OPENAI_API_KEY``, ``HF_TOKEN``, ``WANDB_API_KEY``, ``*_SECRET``, ``*PASSWORD*``; at
  least 8 characters) has that value replaced, wherever it sits.
* **In override strings.** A setting given as text, ``embedder.api_key=sk-...`` (with or without
  a leading ``+``/``++``, its value quoted or not, alone or inside a list such as
  ``intention_overrides=['embedder=openai','embedder.api_key=sk-...']``), has its value replaced
  when the setting's name is a secret's by the first rule. The experiment records its override
  lists as such strings (``experiment.json``, ``trained_on.json``); the run itself keeps the
  key in memory and hands it to the stages it runs.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(r"(?:^|[_\-.])(?:api[_-]?key|apikey|token|secret|password|passwd|authorization)$", re.IGNORECASE)
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NOT_SECRETS = {f"{name}_token" for name in ("pad", "eos", "bos", "unk", "sep", "cls", "mask")}  # tokenizer fields
_PLACEHOLDERS = (None, "", "EMPTY")
_MIN_LENGTH = 8  # shorter values ("1", "true") would redact ordinary text


def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(str(name))) and str(name).lower() not in _NOT_SECRETS


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's secret-named variables, longest first."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if _SECRET_ENV.search(k) and v and len(v) >= _MIN_LENGTH and v != "EMPTY"}
    return sorted(values, key=len, reverse=True)


#: ``name=value`` as Hydra reads an override: a dotted name, then a value that is quoted, or runs
#: up to a space, a comma, a closing bracket or a quote (the end of a list item).
_OVERRIDE = re.compile(r"""(?P<name>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)\s*=\s*(?P<value>"[^"]*"|'[^']*'|[^\s,\]\}'"]+)""")


def _redact_override(match: re.Match) -> str:
    name, value = match.group("name"), match.group("value")
    if not is_secret_key(name.rsplit(".", 1)[-1]) or value.strip("'\"") in _PLACEHOLDERS[1:]:
        return match.group(0)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{name}={quote}{REDACTED}{quote}"


def redact_text(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every secret value of the environment, and the value of every secret-named
    setting written as ``name=value``, replaced by ``<redacted>``."""
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return _OVERRIDE.sub(_redact_override, text) if "=" in text else text


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, strings, scalars) with secrets redacted (module doc)."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, Mapping):
        return {k: (REDACTED if is_secret_key(k) and v not in _PLACEHOLDERS and isinstance(v, (str, int))
                    else redact(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, secrets) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    return obj


def command_line_secrets(argv: list[str]) -> list[str]:
    """The values of secret-named settings on a command line (``oracle.api_key=sk-...``, ``+``/``++``
    prefixed, inside an override list, or a list value ``[sk-...]``), each also without its quotes
    and brackets: what a message echoing the command line must not show."""
    found: set[str] = set()
    for arg in argv:
        for match in _OVERRIDE.finditer(arg):
            if is_secret_key(match.group("name").rsplit(".", 1)[-1]):
                found.add(match.group("value"))
        name, sep, value = arg.lstrip("+").partition("=")
        if sep and is_secret_key(name.rsplit(".", 1)[-1]):
            found.add(value)
            found.update(part.strip(" '\"[]") for part in value.strip("[]").split(","))
    found = {v.strip("'\"") for v in found} | found
    return sorted((v for v in found if v and v not in _PLACEHOLDERS and len(v) >= 4), key=len, reverse=True)


class RedactingStream:
    """A text stream whose every write is :func:`redact_text`-ed with ``secrets`` and the
    environment's (a command's stdout and stderr: Hydra prints its errors and hints there,
    the command line included, before any code of this project runs)."""

    def __init__(self, stream, secrets: list[str]):
        # the environment's read once: a progress bar writes hundreds of times a second
        self._stream, self._secrets = stream, sorted(set(secrets) | set(secret_values()), key=len, reverse=True)

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text, self._secrets))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
