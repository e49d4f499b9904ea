"""Where shipped data and configs live.

The word / city lists and the oracle fact tables ship in the repository's top-level ``dataset/``
folder, the Hydra configs in ``config/``. An editable install (``pip install -e .``) finds both
next to the package; any other layout sets ``ARIA_DATASET_DIR`` / ``ARIA_CONFIG_DIR`` or passes
explicit paths through the Hydra config.
"""
from __future__ import annotations

import copy
import os
import re
from importlib import import_module
from pathlib import Path
from typing import Any, Mapping

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from aria.io import ConfigError
from aria.settings import validated

REPO_ROOT = Path(__file__).resolve().parent.parent


def dataset_dir() -> Path:
    """The folder holding the shipped data files (``ARIA_DATASET_DIR`` overrides)."""
    override = os.environ.get("ARIA_DATASET_DIR")
    path = Path(override) if override else REPO_ROOT / "dataset"
    if not path.is_dir():
        raise FileNotFoundError(
            f"dataset folder not found at {path}; install the repository with `pip install -e .` "
            "or set ARIA_DATASET_DIR to the folder holding twenty_questions_words.json"
        )
    return path


def config_dir() -> Path:
    """The folder of the Hydra configs (``ARIA_CONFIG_DIR`` overrides): what the library composes
    configs from, and what it hands to the processes it launches (``--config-dir``)."""
    override = os.environ.get("ARIA_CONFIG_DIR")
    path = Path(override) if override else REPO_ROOT / "config"
    if not (path / "game").is_dir():
        raise FileNotFoundError(f"config folder not found at {path} (no game/ in it); install the repository with "
                                "`pip install -e .` or set ARIA_CONFIG_DIR to the repository's config/ folder")
    return path


def dataset_file(name: str | os.PathLike) -> Path:
    """Resolve a data file: absolute paths as given, bare names inside :func:`dataset_dir`."""
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    return dataset_dir() / path


#: The schema of each config in config/, by its name there: ``module:class`` beside the code that
#: reads it, imported when asked for (this module sits below every package, which imports it).
SCHEMAS: dict[str, str] = {
    "reinforce_llm": "aria.trainers.settings:TrainerSettings",
    "reward_model": "aria.trainers.settings:RewardModelTrainerSettings",
    "onlinereinforce_llm": "aria.trainers.settings:OnlineTrainerSettings",
    "critic": "aria.trainers.settings:CriticTrainerSettings",
    "experiment": "aria.experiment.settings:ExperimentSettings",
    "collect": "aria.games.common.settings:CollectSettings",
    "eval": "aria.games.common.settings:EvalSettings",
    "intention": "aria.intention.settings:IntentionSettings",
}


def schema(name: str) -> type:
    """The schema of ``config/<name>.yaml`` (:data:`SCHEMAS`)."""
    module, _, cls = SCHEMAS[name].partition(":")
    return getattr(import_module(module), cls)


def load(name: str, cfg: Mapping | Any) -> dict:
    """The config of ``config/<name>.yaml`` (a Hydra config or a dict), checked (:func:`validated`)."""
    return validated(schema(name), cfg, name)



#: Composed configs of this process, by where they were composed from, name, overrides, the state
#: of the YAML files and the environment (see compose_config).
_composed: dict[tuple, dict] = {}


def _yaml_stamp(folders: list[str]) -> tuple:
    """Every YAML file under ``folders`` with its modification time and size: a composed config is
    reused only while the files it came from are as they were."""
    stats = ((path, path.stat()) for folder in folders for path in sorted(Path(folder).rglob("*.yaml")))
    return tuple((str(path), stat.st_mtime_ns, stat.st_size) for path, stat in stats)


def compose_config(name: str, overrides: list[str]) -> dict:
    """A resolved config of ``config/<name>.yaml`` with Hydra overrides, as a plain dict checked
    against its schema (:mod:`aria.settings`).

    Inside a Hydra app the app's config search path is used; elsewhere (tests, library calls) the
    :func:`config_dir`. The experiment runner composes the same configs again at every start and
    resume (a Hydra compose costs 65-85 ms of CPU), so a process keeps what it composed and hands
    out copies; a changed YAML file or environment composes anew.
    """
    in_app = GlobalHydra.instance().is_initialized()
    if in_app:
        folders = [source.path for source in GlobalHydra.instance().config_loader().get_sources() if source.scheme() == "file"]
    else:
        folders = [str(config_dir())]
    # The YAML files read variables of the environment (``${oc.env:OPENAI_API_KEY,EMPTY}``): they are
    # part of what was composed.
    key = (in_app, tuple(folders), name, tuple(overrides), _yaml_stamp(folders), tuple(sorted(os.environ.items())))
    if key not in _composed:
        if in_app:
            _composed[key] = load(name, compose(config_name=name, overrides=overrides))
        else:
            with initialize_config_dir(config_dir=folders[0], version_base="1.3"):
                _composed[key] = load(name, compose(config_name=name, overrides=overrides))
    return copy.deepcopy(_composed[key])


def check_overrides(name: str, overrides: list[str], setting: str) -> dict:
    """``config/<name>.yaml`` composed with ``overrides`` (an override list of another command's
    config, such as the experiment's ``train_overrides``) and checked against its schema, so that a
    mistake in the list is one line naming ``setting`` before any work rather than a failure of
    the stage that uses it, hours in."""
    try:
        return compose_config(name, overrides)  # checked against SCHEMAS[name]
    except ConfigError as err:
        raise ConfigError(f"{setting}: {str(err).removeprefix(f'{name}: ')}") from None
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"{setting}: {hydra_message(err)}") from None


def hydra_message(err: Exception) -> str:
    """Hydra's error as one line. Its hint for a key the config lacks ("To append to your config
    use +key=value") is dropped: every config here has a schema that refuses a new key, so the
    key is a misspelling and the hint would lead to a second refusal."""
    text = " ".join(str(err).split())
    missing = re.match(r"Could not override '([^']+)'\.\s*;?\s*To append to your config use \+", text)
    if missing:
        return f"{missing.group(1)}: no such setting (misspelt? `--cfg job` prints the command's settings)"
    return text[:300]
