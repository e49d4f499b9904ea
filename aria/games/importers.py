"""Importers: the original projects' game logs -> schema-v1 trajectory records.

Each importer reads one file, checks it field by field (a :class:`~aria.io.DataError` names the
file, the line or sample, and the field of the first problem) and returns records built with
:func:`aria.trajectories.make_record`, ``source`` set to the format name. :data:`IMPORTERS` maps
the format names to the importers and :func:`import_file` picks one by name.

Common rules of the single-agent importers. Files are taken whole: nothing in a game's content
stops an import except a malformed field.

* **Questions.** Both originals store the agent's output; the turn's ``action`` is rebuilt as
  ``"Question: <text>"`` (the output format this project's prompt asks for, and the form of ARIA's
  own training actions), and the question is read out of it by the one extractor of play
  (:func:`aria.games.question.text.extract_question`), so a multi-line output ("Based on the information
  provided, my next question would be:\n\nIs your hometown Dalian?") yields its question.
* **Targets.** A name (or, for ``"city,country"``, the part before the comma) is mapped to the
  game's canonical target when it equals a target name or alias after folding case, accents,
  quotes and punctuation ("Bogotá,Colombia" is Bogota). A name outside the game's list ("Mexico
  City") is kept as the game's target, with its other variants as aliases; ``meta.target_in_game``
  says which. No name gives ``null``.
* **Success** (``success_from``): ``"rule"`` (default) applies this project's win rule
  (:meth:`QuestionGame.is_win`, whole phrases, folded) to the last question, with the target's
  name and variants, also for targets outside the list. ``"dataset"`` takes the file's own flag
  instead (``correct``, ``done`` or ``reward``, per format). Both verdicts are kept in ``meta``
  (``rule_success``, ``dataset_success`` and ``dataset_success_field``) and
  :func:`import_summary` counts where they disagree. A game without a target is decided by the
  file's flag (``meta.success_source`` says so); with neither, the import fails on that game.
  Files' flags are not trusted by default because they were computed by other rules: in one
  public Guess My City set, ``done`` came from a substring test that missed accents, so a game
  ending "Is the city you are from Bogotá?" / "Yes, ..." has ``done: false``.
* **Rewards** follow the schema: −1 per turn and 0 on the last turn of a won game.

``aria_msgs`` — ARIA's single-agent logs ``llama3-8b_{game}_msgs.jsonl``, one game per line::

    {"actions": ["Is it an animal?", ...], "obs": ["Yes.", ...], "reward": -1,
     "action_embeddings": [[...], ...], "word": "cat"}

Based on rhyang2021/ARIA: ``README.md`` (the msgs file is the raw input of the pipeline);
``reward_aggregation/twenty_question_clustering/preprocess.py`` and
``reward_aggregation/guess_my_city_clustering/preprocess.py`` (read ``actions`` and one
``action_embeddings`` vector per action, and add an integer ``game_id``);
``reward_aggregation/game_data_processor.py`` (reads ``obs``, one answer per action);
``reward_aggregation/gen_reinforce_single.py`` (renders ``"Question: {actions[i]}\\nAnswer:
{obs[i]}"`` and the training action ``f"Question: {actions[i+1]}"``, so actions are stored
without the ``Question:`` prefix); ``reward_aggregation/reward_utils.py`` (uses ``reward + 1`` as
the game's return); ``evaluation/twenty_questions.py`` and ``evaluation/guess_my_city.py``
(``_step``: reward −1, or 0 when the question wins, which ends the game; the target lives in
``curr_word``, and ``evaluation/main.py`` logs it as ``curr_world``).

* ``reward`` is required and is the file's success flag (``success_from="dataset"``). A number is
  the environment's last-step reward: 0 = the last question won, −1 = not won. That reading is what ``reward + 1`` in
  ``reward_utils.py`` needs, and the released training sample's rewards lie in [0, 0.95] (a sum of
  per-turn rewards would make most of them negative). A list is one reward per action, each 0 or
  −1, with 0 allowed only on the last turn; success is "the last one is 0". Other values are an
  error rather than a guess.
* ``obs`` (or ``next_observations``, the key of the release's Guess My City logs) has one answer
  per action, or one fewer when the file says the game was won (the winning question went
  unanswered); that turn's observation is then the game's ``win_answer`` and ``meta`` records
  ``last_observation_filled``. Where the win rule decides the game was lost after all, that
  answer is unknown and the line is refused. A line with both keys must give the same answers.
* An action that already starts with ``Question:`` is kept as it is.
* ``game_id`` is the file's own ``game_id`` (string or integer) when present, else
  ``f"{file stem}-{line:06d}"``; a repeated id is an error.

``archer`` — the LMRL-Gym / ArCHer conversation JSON: one list of games::

    [{"lines": ["Is it an animal? Yes.", ...], "correct": true, "word": ["Lion"]}, ...]

Based on abdulhaim/LMRL-Gym: the twenty-questions dataset README (``lines`` of "question answer",
at most 20; ``correct``: whether the guesser guessed the word; ``word``: a list of variants);
``llm_rl_scripts/twenty_questions/env/data.py`` and ``llm_rl_scripts/guess_city/env/data.py``
(``split_question_answer`` splits a line at its last ``"? "``; ``correct`` marks the last
question as the winning one); and YifeiZhou02/ArCHer ``scripts/run_bc.py`` (reads the same
``lines``) and ``archer/environment/twenty_questions.py`` (its ``done`` is "won *or* out of
turns").

* The list of lines is ``lines`` (the released files) or ``conversation``.
* Splitting a line: the answer is the text after the last ``"? "`` (LMRL-Gym's
  ``split_question_answer``; for Twenty Questions this is "Yes."/"No."/"Invalid Question.", for
  Guess My City the free-form answer sentence). A line without ``"? "`` is split when it ends
  with a space and a fixed answer (``Yes.``, ``No.`` or the game's invalid-question answer), so
  "Tell me the word. Invalid Question." splits too; any other line is an error.
* The file's success flag is ``correct`` when present, else ``done``. In ArCHer's environment
  ``done`` means "won *or* out of turns", in LMRL-Gym's city data "guessed": read it with
  ``success_from="dataset"`` only for files where it means a win. ``word`` is a name, a list of
  variants, or ``"city,country"``.
* ``game_id`` is ``f"{file stem}-{sample index:06d}"``.

``aria_two_player`` — ARIA's two-player logs ``llama3-8b_{bargaining,negotiation}_embedding_msgs.jsonl``,
one game per line (``../shared/data/aria_sample_llama3-8b_negotiation_embedding_msgs.jsonl``)::

    {"player_1_name": "Alice", "player_2_name": "Bob", "alice_actions": [...], "bob_actions": [...],
     "alice_ids": [0, 2, 4], "bob_ids": [1, 3], "alice_reward": 0.5, "bob_reward": 0.5,
     "alice_action_embeddings": [[...], ...], "bob_actions_embeddings": [[...], ...], ...}

* ``alice_ids`` / ``bob_ids`` are the speaking positions of each player's messages; together they
  must be exactly 0..n−1. Turns are rebuilt in that order with roles ``alice`` and ``bob``.
* A list field may also be a JSON-encoded string of a list (some released files store them so).
* ``alice_reward`` / ``bob_reward`` are the roles' final rewards (the original's normalised payoff
  share, 0.5 each for a tie or no deal) and are required: each in [0, 1], summing to 1 (a raw
  payoff, which would change the scale of every update, is refused).
* Embeddings (``alice_action_embeddings``; Bob's key is ``bob_actions_embeddings`` in the released
  files, ``bob_action_embeddings`` is read too) are optional, one vector per message.
* Everything else (system prompts, the game's parameters, gains) is kept in ``meta``.
* ``game_id`` as for ``aria_msgs``.

:func:`parse_history` reads the game history back out of a prompt of the original's training set
(``actor_reinforce_*.json``, made by ``gen_reinforce_single.py``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from aria.games.common.base import load_game_config
from aria.games.family import FAMILIES, QuestionFamily, TwoPlayerFamily, family_of
from aria.games.question.game import QuestionGame, load_game
from aria.games.question.text import normalize
from aria.io import ConfigError, DataError, find_non_finite, is_finite_number, iter_jsonl, parse_json, read_json, require
from aria.trajectories import VectorWidth, make_record, write_trajectories


# Keys that may hold an ARIA game's target, in the order they are tried.
ARIA_TARGET_KEYS = ("word", "target", "city", "object", "curr_word", "curr_world")
# Answers that may end a line without "? " (with the game's invalid-question answer).
FIXED_ANSWERS = ("Yes.", "No.")

_HISTORY_HEADER = "Here is the game history:\n"
_HISTORY_TURN = re.compile(r"Question: (.*)\nAnswer: (.*)\n\n")

Importer = Callable[[Path, QuestionGame, str], list[dict]]  # (file, game, success_from) -> records


# ---- games ------------------------------------------------------------------------------
# ---- shared checks ----------------------------------------------------------------------
def _field(obj: dict, key: str, types: type | tuple[type, ...], path: Path, line: int | None, where: str) -> Any:
    """``obj[key]`` checked like :func:`aria.io.require`, the field named ``where + key``."""
    try:
        return require(obj, key, types, path, line)
    except DataError as err:
        raise DataError(path, line, f"{where}{key}", err.problem) from None


def _string_list(obj: dict, key: str, path: Path, line: int | None, where: str = "") -> list[str]:
    """``obj[key]`` as a non-empty list of strings (a game has at least one turn)."""
    values = _field(obj, key, list, path, line, where)
    if not values:
        raise DataError(path, line, f"{where}{key}", "empty list (a game has at least one turn)")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise DataError(path, line, f"{where}{key}[{i}]", f"expected a string, got {type(value).__name__}")
    return values


# ---- targets and success ----------------------------------------------------------------
#: Where a single-agent game's success comes from (see the module doc).
SUCCESS_SOURCES = ("rule", "dataset")


@dataclass(frozen=True)
class ResolvedTarget:
    """A game's target as imported: the name, its other variants, whether the game lists it."""

    name: str | None
    aliases: tuple[str, ...] = ()
    in_game: bool = False


def _city_part(name: str) -> str:
    return name.split(",")[0].strip()


def _canonical_target(game: QuestionGame, name: str) -> str | None:
    """The game's canonical name for ``name`` (or for the city part of "city,country"), folded."""
    wanted = {normalize(name), normalize(_city_part(name))} - {""}
    for target in game.targets:
        if any(normalize(alias) in wanted for alias in target.names):
            return target.name
    return None


def resolve_target(game: QuestionGame, raw: str | list[str] | None) -> ResolvedTarget:
    """The canonical target for a name or a list of variant names; else the first name as given."""
    names = [raw] if isinstance(raw, str) else list(raw or [])
    for name in names:
        canonical = _canonical_target(game, name)
        if canonical is not None:
            return ResolvedTarget(canonical, (), True)
    if not names or not _city_part(names[0]):
        return ResolvedTarget(None)
    variants = list(dict.fromkeys(_city_part(n) for n in names if _city_part(n)))
    return ResolvedTarget(variants[0], tuple(variants[1:]), False)


def decide_success(game: QuestionGame, target: ResolvedTarget, last_output: str, flag: bool | None, flag_field: str,
                   success_from: str, path: Path, line: int | None, where: str = "") -> tuple[bool, dict]:
    """The game's success by ``success_from`` and the ``meta`` fields that record both verdicts.

    ``flag`` is the file's own success flag (None when the file has none) read from ``flag_field``.
    """
    if success_from not in SUCCESS_SOURCES:
        raise ConfigError(f"unknown success source {success_from!r} (known: {', '.join(SUCCESS_SOURCES)})")
    meta: dict[str, Any] = {}
    rule = None
    if target.name is not None:
        rule = game.is_win(game.extract_question(as_action(last_output)), target.name, target.aliases)
        meta["rule_success"] = rule
        meta["target_in_game"] = target.in_game
    if flag is not None:
        meta["dataset_success"] = flag
        meta["dataset_success_field"] = flag_field
    if success_from == "rule" and rule is not None:
        meta["success_source"] = "rule"
        return rule, meta
    if flag is None:
        problem = "missing: the game has no target to apply the win rule to" if rule is None else "missing"
        raise DataError(path, line, f"{where}{flag_field}", f"{problem} (success comes from the file's flag)")
    meta["success_source"] = "dataset" if success_from == "dataset" else "dataset (no target for the win rule)"
    return flag, meta


def import_summary(records: list[dict]) -> str:
    """One line on imported single-agent games: wins by each rule, disagreements, unknown targets."""
    n = len(records)
    if not n:
        return "0 games"
    meta = [r.get("meta", {}) for r in records]
    wins = sum(r["success"] for r in records)
    by_rule = [m["rule_success"] for m in meta if "rule_success" in m]
    by_flag = [m["dataset_success"] for m in meta if "dataset_success" in m]
    fields = sorted({m["dataset_success_field"] for m in meta if "dataset_success_field" in m})
    flag_name = "/".join(f"'{f}'" for f in fields) or "flag"
    sources = sorted({m.get("success_source", "rule") for m in meta})
    parts = [f"{n} games; success from {' and '.join(sources)}: {wins}/{n} won ({wins / n:.1%})"]
    if by_rule:
        parts.append(f"win rule: {sum(by_rule)}/{len(by_rule)} won")
    if by_flag:
        parts.append(f"the file's {flag_name}: {sum(by_flag)}/{len(by_flag)} won")
    both = [m for m in meta if "rule_success" in m and "dataset_success" in m]
    if both:
        parts.append(f"the two disagree on {sum(m['rule_success'] != m['dataset_success'] for m in both)} of {len(both)} games")
    outside = sum(m.get("target_in_game") is False for m in meta)
    no_target = sum(r["target"] is None for r in records)
    parts.append(f"{outside} targets outside the game's list" + (f", {no_target} games without a target" if no_target else ""))
    return "; ".join(parts)


def as_action(text: str) -> str:
    """The agent's output in this project's format: ``"Question: <text>"`` unless already so."""
    return text if text.lstrip().lower().startswith("question:") else f"Question: {text.strip()}"


def build_turns(
    game: QuestionGame,
    questions: list[str],
    observations: list[str],
    success: bool,
    embeddings: list[list[float]] | None = None,
) -> list[dict]:
    """Schema turns: −1 per turn, 0 on the last turn of a won game; embeddings copied over."""
    turns = []
    for i, (text, observation) in enumerate(zip(questions, observations)):
        action = as_action(text)
        turn = {
            "action": action,
            "question": game.extract_question(action),
            "observation": observation,
            "reward": game.turn_reward(success and i == len(questions) - 1),
        }
        if embeddings is not None:
            turn["embedding"] = list(embeddings[i])
        turns.append(turn)
    return turns


# ---- aria_msgs --------------------------------------------------------------------------
def _check_step_reward(value: Any, path: Path, line: int, field: str) -> None:
    if not is_finite_number(value) or value not in (0, -1):
        raise DataError(path, line, field, f"expected 0 (won) or -1 (not won), got {value!r:.40}")


def _aria_flag(obj: dict, num_actions: int, path: Path, line: int) -> bool:
    """The file's success flag from ``reward``: a last-step reward (0 = won) or per-turn rewards."""
    reward = require(obj, "reward", (int, float, list), path, line)
    if not isinstance(reward, list):
        _check_step_reward(reward, path, line, "reward")
        return reward == 0
    if len(reward) != num_actions:
        raise DataError(path, line, "reward", f"has {len(reward)} per-turn rewards for {num_actions} actions")
    for i, value in enumerate(reward):
        _check_step_reward(value, path, line, f"reward[{i}]")
        if value == 0 and i < num_actions - 1:
            raise DataError(path, line, f"reward[{i}]", "a win (0) before the last turn")
    return reward[-1] == 0


def _aria_observations(obj: dict, num_actions: int, won: bool, game: QuestionGame, path: Path, line: int) -> list[str]:
    """One answer per action; a won game's unanswered last question gets the game's win answer."""
    key = "obs" if "obs" in obj or "next_observations" not in obj else "next_observations"
    if "obs" in obj and "next_observations" in obj and obj["obs"] != obj["next_observations"]:
        raise DataError(path, line, "next_observations", "differs from obs: a game's answers twice, and not the same "
                                                         "(keep one of the two keys)")
    observations = _field(obj, key, list, path, line, "")
    for i, value in enumerate(observations):
        if not isinstance(value, str):
            raise DataError(path, line, f"{key}[{i}]", f"expected a string, got {type(value).__name__}")
    if len(observations) == num_actions:
        return observations
    if len(observations) == num_actions - 1 and won:
        return [*observations, game.win_answer]
    raise DataError(
        path, line, key,
        f"has {len(observations)} answers for {num_actions} actions "
        f"(expected {num_actions}, or {num_actions - 1} when the last action won)",
    )


def _aria_embeddings(obj: dict, num_actions: int, path: Path, line: int, widths: VectorWidth) -> list[list[float]] | None:
    """``action_embeddings`` when present: one non-empty list of numbers per action, all of one width."""
    if "action_embeddings" not in obj:
        return None
    embeddings = require(obj, "action_embeddings", list, path, line)
    if len(embeddings) != num_actions:
        raise DataError(path, line, "action_embeddings", f"has {len(embeddings)} vectors for {num_actions} actions")
    for i, vector in enumerate(embeddings):
        widths.check(vector, path, line, f"action_embeddings[{i}]")
    return embeddings


def _aria_game_id(obj: dict, path: Path, line: int) -> str:
    """The file's own ``game_id`` (string or integer) or ``<stem>-<line>``."""
    if "game_id" not in obj:
        return f"{path.stem}-{line:06d}"
    value = obj["game_id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise DataError(path, line, "game_id", f"expected a non-empty string or an integer, got {value!r}")
    return str(value)


def _aria_target(obj: dict, game: QuestionGame, path: Path, line: int) -> tuple[ResolvedTarget, Any]:
    key = next((k for k in ARIA_TARGET_KEYS if k in obj), None)
    if key is None or obj[key] is None:
        return ResolvedTarget(None), None
    raw = obj[key]
    if not (isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(n, str) for n in raw))):
        raise DataError(path, line, key, "expected a name or a non-empty list of names")
    return resolve_target(game, raw), raw


def _target_meta(target: ResolvedTarget, raw: Any) -> dict:
    """The file's own target value, when it says more than the name kept."""
    return {"source_target": raw} if raw is not None and raw not in (target.name, [target.name]) else {}


def _aria_record(obj: dict, game: QuestionGame, path: Path, line: int, success_from: str, widths: VectorWidth) -> dict:
    actions = _string_list(obj, "actions", path, line)
    flag = _aria_flag(obj, len(actions), path, line)
    observations = _aria_observations(obj, len(actions), flag, game, path, line)
    target, raw = _aria_target(obj, game, path, line)
    success, verdicts = decide_success(game, target, actions[-1], flag, "reward", success_from, path, line)
    meta: dict[str, Any] = {"source_line": line, **verdicts, **_target_meta(target, raw)}
    if len(observations) > len(obj.get("obs", obj.get("next_observations", []))):
        if not success:  # the win answer would be invented for a question that, by the rule, did not win
            raise DataError(path, line, "obs" if "obs" in obj else "next_observations",
                            f"the file says the last question won and leaves it unanswered, but by the win rule "
                            f"{actions[-1]!r:.80} does not win {target.name!r}, so its answer is unknown (give it in "
                            f"the file, or import with success from the dataset's flag)")
        meta["last_observation_filled"] = True
    return make_record(
        game_id=_aria_game_id(obj, path, line),
        game=game.name,
        target=target.name,
        turns=build_turns(game, actions, observations, success, _aria_embeddings(obj, len(actions), path, line, widths)),
        success=success,
        source="aria_msgs",
        meta=meta,
    )


def import_aria_msgs(path: Path, game: QuestionGame, success_from: str = "rule") -> list[dict]:
    """Records from an ARIA ``llama3-8b_{game}_msgs.jsonl`` file (see the module doc)."""
    records: list[dict] = []
    seen: dict[str, int] = {}
    widths = VectorWidth()
    for line, obj in iter_jsonl(path):
        record = _aria_record(obj, game, path, line, success_from, widths)
        if record["game_id"] in seen:
            raise DataError(path, line, "game_id", f"{record['game_id']!r} already on line {seen[record['game_id']]}")
        seen[record["game_id"]] = line
        records.append(record)
    return records


# ---- archer (LMRL-Gym / ArCHer conversations) -------------------------------------------
def split_line(game: QuestionGame, text: str) -> tuple[str, str] | None:
    """``(question, answer)`` of a conversation line, or ``None`` when it cannot be split.

    LMRL-Gym's rule first (the answer follows the last ``"? "``); a line without ``"? "`` may
    still end in a fixed answer ("Tell me the word. Invalid Question.").
    """
    question, sep, answer = text.rpartition("? ")
    if sep and question.strip() and answer.strip():
        return question.strip() + "?", answer.strip()
    for answer in (*FIXED_ANSWERS, game.invalid_answer):
        if text.endswith(" " + answer) and text[: -len(answer)].strip():
            return text[: -len(answer)].strip(), answer
    return None


def _archer_pairs(sample: dict, game: QuestionGame, path: Path, where: str) -> list[tuple[str, str]]:
    if "lines" not in sample and "conversation" not in sample:
        raise DataError(path, None, f"{where}lines", "missing (nor is there a 'conversation')")
    key = "lines" if "lines" in sample else "conversation"
    pairs = []
    for j, text in enumerate(_string_list(sample, key, path, None, where)):
        pair = split_line(game, text)
        if pair is None:
            raise DataError(path, None, f"{where}{key}[{j}]", f"cannot split {text!r} into a question and an answer")
        pairs.append(pair)
    return pairs


def _archer_word(sample: dict, path: Path, where: str) -> str | list[str]:
    word = _field(sample, "word", (str, list), path, None, where)
    if isinstance(word, list) and not (word and all(isinstance(n, str) for n in word)):
        raise DataError(path, None, f"{where}word", "expected a name or a non-empty list of names")
    return word


def _archer_flag(sample: dict, path: Path, where: str) -> tuple[bool | None, str]:
    """The file's own success flag: ``correct`` when present, else ``done``, else None."""
    for key in ("correct", "done"):
        if key in sample:
            return _field(sample, key, bool, path, None, where), key
    return None, "correct"


def _archer_record(sample: Any, index: int, game: QuestionGame, path: Path, success_from: str) -> dict:
    where = f"[{index}]."
    if not isinstance(sample, dict):
        raise DataError(path, None, f"[{index}]", f"expected an object, got {type(sample).__name__}")
    pairs = _archer_pairs(sample, game, path, where)
    raw = _archer_word(sample, path, where)
    target = resolve_target(game, raw)
    flag, flag_field = _archer_flag(sample, path, where)
    success, verdicts = decide_success(game, target, pairs[-1][0], flag, flag_field, success_from, path, None, where)
    questions, answers = [q for q, _ in pairs], [a for _, a in pairs]
    return make_record(
        game_id=f"{path.stem}-{index:06d}",
        game=game.name,
        target=target.name,
        turns=build_turns(game, questions, answers, success),
        success=success,
        source="archer",
        meta={"source_index": index, **verdicts, **_target_meta(target, raw)},
    )


def import_archer(path: Path, game: QuestionGame, success_from: str = "rule") -> list[dict]:
    """Records from an LMRL-Gym / ArCHer conversation JSON list (see the module doc)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(path, None, None, f"expected a JSON list of conversations, got {type(data).__name__}")
    return [_archer_record(sample, i, game, path, success_from) for i, sample in enumerate(data)]


# ---- registry ---------------------------------------------------------------------------
IMPORTERS: dict[str, Importer] = {
    "aria_msgs": import_aria_msgs,
    "archer": import_archer,
}


# ---- two-player games -------------------------------------------------------------------
TWO_PLAYER_ROLES = ("alice", "bob")


def _maybe_json_list(obj: dict, key: str, path: Path, line: int) -> list:
    value = require(obj, key, (list, str), path, line)
    if isinstance(value, str):
        try:
            value = parse_json(value, path, line)
        except DataError as err:  # the same reader as a file's lines, its problem placed in this field
            # the reader's field is a path into the value ("[0]") or, for a repeated key, that key
            field = key if not err.field else f"{key}{err.field}" if err.field.startswith("[") else f"{key}.{err.field}"
            raise DataError(path, line, field, err.problem if err.field else f"a string that is not a JSON list: {err.problem}") from None
        if not isinstance(value, list):
            raise DataError(path, line, key, "a JSON string that does not hold a list")
    return value


def _two_player_turns(obj: dict, path: Path, line: int, widths: VectorWidth) -> list[dict]:
    by_position: dict[int, dict] = {}
    origin: dict[int, str] = {}  # position -> the field that gave it
    for role in TWO_PLAYER_ROLES:
        actions = _maybe_json_list(obj, f"{role}_actions", path, line)
        positions = _maybe_json_list(obj, f"{role}_ids", path, line)
        if not all(isinstance(a, str) for a in actions):
            raise DataError(path, line, f"{role}_actions", "expected a list of strings")
        if len(positions) != len(actions) or not all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
            raise DataError(path, line, f"{role}_ids", f"expected {len(actions)} integer positions, one per action")
        embeddings = None
        for key in (f"{role}_action_embeddings", f"{role}_actions_embeddings"):
            if key in obj:
                embeddings = _maybe_json_list(obj, key, path, line)
                if len(embeddings) != len(actions):
                    raise DataError(path, line, key, f"has {len(embeddings)} vectors for {len(actions)} actions")
                for i, vector in enumerate(embeddings):
                    widths.check(vector, path, line, f"{key}[{i}]")
                break
        for i, (position, action) in enumerate(zip(positions, actions)):
            if position in by_position:
                raise DataError(path, line, f"{role}_ids[{i}]", f"position {position} is used twice")
            origin[position] = f"{role}_ids[{i}]"
            turn = {"role": role, "action": action}
            if embeddings is not None:
                turn["embedding"] = [float(x) for x in embeddings[i]]
            by_position[position] = turn
    if not by_position:
        raise DataError(path, line, "alice_actions", "no action of either player (a game has at least one turn)")
    # n distinct positions are 0..n-1 exactly when none lies outside it: name the first that does
    for position in sorted(by_position, key=lambda p: (0 <= p < len(by_position), p)):
        if not 0 <= position < len(by_position):
            shown = str(position) if len(str(position)) <= 40 else f"{str(position)[:20]}... ({len(str(position))} digits)"
            raise DataError(path, line, origin[position], f"position {shown}, but the game's {len(by_position)} messages "
                                                          f"are at positions 0..{len(by_position) - 1}")
    return [by_position[p] for p in range(len(by_position))]


def _two_player_record(obj: dict, game: str, path: Path, line: int, widths: VectorWidth) -> dict:
    rewards = {}
    for role in TWO_PLAYER_ROLES:
        value = require(obj, f"{role}_reward", (int, float), path, line)
        if not is_finite_number(value):
            raise DataError(path, line, f"{role}_reward", "not a finite number")
        if not 0 <= value <= 1:
            raise DataError(path, line, f"{role}_reward", f"{value!r:.40} is outside [0, 1]: expected the role's share of "
                                                          "the payoffs (docs/games.md), not a raw payoff")
        rewards[role] = float(value)
    if abs(sum(rewards.values()) - 1) > 1e-6:
        raise DataError(path, line, "bob_reward", f"alice_reward + bob_reward = {sum(rewards.values()):.6g}, expected 1 "
                                                  "(the roles' shares of the payoffs, 0.5 each for a tie or no deal)")
    turns = _two_player_turns(obj, path, line, widths)
    skip = {f"{r}_{k}" for r in TWO_PLAYER_ROLES for k in ("actions", "ids", "reward", "action_embeddings", "actions_embeddings")}
    meta = {"source_line": line, **{k: v for k, v in obj.items() if k not in skip and k != "game_id"}}
    if field := find_non_finite(meta):
        raise DataError(path, line, field, "not a finite number (NaN and infinities are not JSON)")
    return make_record(
        game_id=_aria_game_id(obj, path, line), game=game, players=list(TWO_PLAYER_ROLES), turns=turns,
        role_rewards=rewards, source="aria_two_player", meta=meta,
    )


def import_aria_two_player(path: Path, game: str) -> list[dict]:
    """Records from an ARIA two-player ``*_embedding_msgs.jsonl`` file (see the module doc)."""
    records: list[dict] = []
    seen: dict[str, int] = {}
    widths = VectorWidth()
    for line, obj in iter_jsonl(path):
        record = _two_player_record(obj, game, path, line, widths)
        if record["game_id"] in seen:
            raise DataError(path, line, "game_id", f"{record['game_id']!r} already on line {seen[record['game_id']]}")
        seen[record["game_id"]] = line
        records.append(record)
    return records


#: Importers of two-player logs; they take the game's name (no question-game rules apply).
TWO_PLAYER_IMPORTERS: dict[str, Callable[[Path, str], list[dict]]] = {"aria_two_player": import_aria_two_player}
#: The game family (:mod:`aria.games.family`) each format's games belong to.
FORMAT_FAMILIES = {**{fmt: QuestionFamily.kind for fmt in IMPORTERS}, **{fmt: TwoPlayerFamily.kind for fmt in TWO_PLAYER_IMPORTERS}}


def import_file(
    path: str | os.PathLike,
    fmt: str,
    game: str | QuestionGame,
    out_path: str | os.PathLike | None = None,
    success_from: str = "rule",
) -> list[dict]:
    """Import ``path`` with the importer named ``fmt``; write the records to ``out_path`` if given.

    ``game`` is a game name (its config is loaded) or a built :class:`QuestionGame`;
    ``success_from`` is ``"rule"`` or ``"dataset"`` for single-agent games (see the module doc).
    The output is validated and written atomically by :func:`aria.trajectories.write_trajectories`.
    """
    if success_from not in SUCCESS_SOURCES:
        raise ConfigError(f"unknown success source {success_from!r} (known: {', '.join(SUCCESS_SOURCES)})")
    name = game if isinstance(game, str) else game.name
    family = family_of(load_game_config(name))
    holds = FAMILIES[FORMAT_FAMILIES[fmt]] if fmt in FORMAT_FAMILIES else family
    if holds is not family:
        raise ConfigError(f"format {fmt} holds {holds.title} games; {name} is a {family.title} game")
    if out_path is not None and Path(out_path).is_dir():
        raise ConfigError(f"{out_path} is a folder; give the trajectories file to write")
    if fmt in TWO_PLAYER_IMPORTERS:
        records = TWO_PLAYER_IMPORTERS[fmt](Path(path), game if isinstance(game, str) else game.name)
    elif fmt in IMPORTERS:
        records = IMPORTERS[fmt](Path(path), load_game(game) if isinstance(game, str) else game, success_from)
    else:
        raise ConfigError(f"unknown format {fmt!r} (known: {', '.join(sorted([*IMPORTERS, *TWO_PLAYER_IMPORTERS]))})")
    if not records:  # an empty file, or one of blank lines: nothing to train on, and likely the wrong file
        raise DataError(path, None, None, f"no games in the file (expected one JSON object per line, format {fmt})")
    if out_path is not None:
        write_trajectories(out_path, records)
    return records


# ---- training-set prompts ---------------------------------------------------------------
def parse_history(observation: str) -> list[tuple[str, str]]:
    """The ``(question, answer)`` turns in a prompt's ``"Here is the game history:"`` block.

    The block is ``"Question: q\\nAnswer: a\\n\\n"`` per turn (the original's training set, see
    ``gen_reinforce_single.py``); a prompt without the block has no history. Rendering the result
    with the game's prompt gives the observation back (checked by the tests on released samples).
    """
    start = observation.find(_HISTORY_HEADER)
    if start < 0:
        return []
    position = start + len(_HISTORY_HEADER)
    history = []
    while (match := _HISTORY_TURN.match(observation, position)) is not None:
        history.append((match.group(1), match.group(2)))
        position = match.end()
    return history
