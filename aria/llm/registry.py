"""Policies by name (``config/policy/<name>.yaml``): which class plays, imported only when built.

A registry of import paths rather than classes, so that naming a policy loads nothing: the local
model's torch and transformers, the expert's fact tables and the vLLM launcher are imported by
:func:`build_policy` for the one policy a run uses, and no module that plays games imports
another to reach a policy (no import cycles; ``tests/test_imports.py``).
"""
from __future__ import annotations

from typing import Any, Mapping

from aria.io import ConfigError
from aria.llm.base import ChatModel
from aria.registry import check_options, load_object

#: name -> "module:Class"; the class takes the config's other keys as keyword arguments.
POLICIES: dict[str, str] = {
    "local": "aria.llm.local:LocalChatModel",  # a Hugging Face model in this process
    "endpoint": "aria.llm.endpoint:EndpointChatModel",  # an OpenAI-compatible server
    "vllm": "aria.llm.served:ServedChatModel",  # a vLLM server started for the run
    "scripted": "aria.games.question.expert:ScriptedExpertPolicy",  # the scripted expert questioner
}


def build_policy(cfg: Mapping[str, Any], setting: str = "policy") -> ChatModel:
    """The policy named by ``cfg["name"]`` (a key of :data:`POLICIES`), other keys as options,
    checked first (:func:`check_policy`)."""
    policy_class, options = check_policy(cfg, setting)
    return policy_class(**options)


def check_policy(cfg: Mapping[str, Any], setting: str = "policy") -> tuple[type, dict[str, Any]]:
    """The class and options of the policy ``cfg`` names, checked before anything loads: a name
    not registered, or options :func:`aria.registry.check_options` refuses, is a ``ConfigError``
    naming ``setting`` (the config section: ``policy``, ``opponent``)."""
    options = dict(cfg)
    kind = options.pop("name", None)
    if kind not in POLICIES:
        raise ConfigError(f"{setting}.name: unknown policy {kind!r} (known: {', '.join(sorted(POLICIES))})")
    policy_class = load_object(POLICIES[kind])
    check_options(policy_class, options, setting, f"the {kind} policy")
    return policy_class, options


def reply_tokens_key(policy_cfg) -> str:
    """The policy config's name for the reply length: ``max_new_tokens`` for a local transformers
    model, ``max_tokens`` for a served one (the OpenAI API's: endpoint, vllm)."""
    return "max_new_tokens" if policy_cfg["name"] == "local" else "max_tokens"
