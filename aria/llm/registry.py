"""Policies by name (``config/policy/<name>.yaml``): which class plays, imported only when built.

A registry of import paths rather than classes, so that naming a policy loads nothing: the local
model's torch and transformers, the expert's fact tables and the vLLM launcher are imported by
:func:`build_policy` for the one policy a run uses, and no module that plays games imports
another to reach a policy (no import cycles; ``tests/test_imports.py``).
"""
from __future__ import annotations

from typing import Any, Mapping

from aria.llm.base import ChatModel
from aria.registry import load_object

#: name -> "module:Class"; the class takes the config's other keys as keyword arguments.
POLICIES: dict[str, str] = {
    "local": "aria.llm.local:LocalChatModel",  # a Hugging Face model in this process
    "endpoint": "aria.llm.endpoint:EndpointChatModel",  # an OpenAI-compatible server
    "vllm": "aria.llm.served:ServedChatModel",  # a vLLM server started for the run
    "scripted": "aria.games.question.expert:ScriptedExpertPolicy",  # the scripted expert questioner
}


#: The ranges of the options the policies share, by name: the policies' sections are config
#: groups of different shapes (no one schema in aria.settings), so these are checked by name.
OPTION_BOUNDS: dict[str, dict[str, Any]] = {
    "temperature": {"ge": 0}, "top_p": {"gt": 0, "le": 1}, "timeout_s": {"gt": 0}, "retry_base_delay_s": {"ge": 0},
    "epsilon": {"ge": 0, "le": 1},
    # whole numbers
    "max_tokens": {"ge": 1}, "max_new_tokens": {"ge": 1}, "max_prompt_tokens": {"ge": 1}, "concurrency": {"ge": 1},
    "max_retries": {"ge": 0},
}
WHOLE_OPTIONS = ("max_tokens", "max_new_tokens", "max_prompt_tokens", "concurrency", "max_retries")


def _option_problem(key: str, value: Any) -> str | None:
    from aria.settings import out_of_bounds

    if key not in OPTION_BOUNDS or value is None:
        return None
    whole = key in WHOLE_OPTIONS
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return "a whole number" if whole else "a number"
    return out_of_bounds(value if whole else float(value), OPTION_BOUNDS[key])


def build_policy(cfg: Mapping[str, Any], setting: str = "policy") -> ChatModel:
    """The policy named by ``cfg["name"]`` (a key of :data:`POLICIES`), other keys as options,
    checked first (:func:`check_policy`)."""
    policy_class, options = check_policy(cfg, setting)
    return policy_class(**options)


def check_policy(cfg: Mapping[str, Any], setting: str = "policy") -> tuple[type, dict[str, Any]]:
    """The class and options of the policy ``cfg`` names, checked before anything loads: a name
    not registered, a key its class does not take, or a value out of :data:`OPTION_BOUNDS` is a
    ``ConfigError`` naming ``setting`` (the config section: ``policy``, ``opponent``)."""
    import inspect

    from aria.io import ConfigError

    options = dict(cfg)
    kind = options.pop("name", None)
    if kind not in POLICIES:
        raise ConfigError(f"{setting}.name: unknown policy {kind!r} (known: {', '.join(sorted(POLICIES))})")
    policy_class = load_object(POLICIES[kind])
    known = [p for p in inspect.signature(policy_class).parameters if p not in ("self", "name")]
    for key, value in options.items():
        if key not in known:
            raise ConfigError(f"{setting}.{key}: not an option of the {kind} policy (known: {', '.join(known)})")
        if wanted := _option_problem(key, value):
            raise ConfigError(f"{setting}.{key}: expected {wanted}, got {value!r}")
    return policy_class, options


def reply_tokens_key(policy_cfg) -> str:
    """The policy config's name for the reply length: ``max_tokens`` for a served model (the
    OpenAI API's), ``max_new_tokens`` for a local transformers model."""
    return "max_tokens" if policy_cfg["name"] == "endpoint" else "max_new_tokens"
