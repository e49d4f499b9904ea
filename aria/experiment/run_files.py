"""What the report reads of a run folder, each file checked as the runner would trust it.

The runner trusts a file only under the settings and models that made it (a producer record, a
training marker's digest, a movement key) and otherwise plays, trains or measures again. A run
folder can also reach the report edited, copied or assembled by hand; these readers hold every
file to the same rules, so such a folder is one :class:`~aria.io.DataError` naming the file and
its field, never another model's games counted as an arm's or a traceback in the template.
:mod:`aria.experiment.report` computes and words the results from what they return.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema

from aria.experiment.layout import Layout, iterations_of, model_version, recorded_path
from aria.experiment.settings import ExperimentSettings
from aria.games.family import family_of
from aria.io import DataError, differences, read_json
from aria.trajectories import producer_path, read_producer, read_trajectories


# ---- a file of the run, checked against what the report reads of it ----------------------------------------
# A file damaged or edited by hand is one error naming the file and the field (JSON Schema's path),
# not a traceback in the verdict or the template. Fields a file gained over time are optional.
NUMBER, MAYBE_NUMBER = {"type": "number"}, {"type": ["number", "null"]}
SHARE = {"type": "number", "minimum": 0, "maximum": 1}
K_PER_POOL = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}
MOVEMENT = {  # aria.experiment.movement.movement; a log-prob change is null where no step of won (lost) games
    "type": "object", "required": ["key", "token_kl", "logprob_change_won", "logprob_change_lost", "weights"],
    "properties": {"key": {"type": "object", "required": ["parent", "parent_version", "child_version"]},  # check_movement_key
                   "token_kl": NUMBER, "logprob_change_won": MAYBE_NUMBER, "logprob_change_lost": MAYBE_NUMBER,
                   "token_kl_ci95": {"type": "array", "items": NUMBER, "minItems": 2, "maxItems": 2},
                   "weights": {"type": "object", "required": ["dtype", "share"],
                               "properties": {"dtype": {"type": "string"}, "share": SHARE, "kept_share": SHARE,
                                              "changed": {"type": "integer"}, "changed_float32": {"type": "integer"}}}}}
PREFLIGHT = {  # aria.intention.pipeline's pre-flight of a labelling: one row a k (or the behavioural labels)
    "type": "object", "required": ["steps", "rows"],
    "properties": {"steps": {"type": "integer"}, "rows": {"type": "array", "items": {
        "type": "object", "required": ["k", "chosen", "shared", "shared_by_turn", "mean_abs_change", "variance_ratio"],
        "properties": {"k": K_PER_POOL, "chosen": {"type": "boolean"}, "trained": {"type": "boolean"},
                       "labels": {"type": "string"}, "shared": NUMBER,
                       "shared_by_turn": {"type": "object", "additionalProperties": NUMBER},
                       "mean_abs_change": MAYBE_NUMBER, "variance_ratio": MAYBE_NUMBER}}}}}
STAGE_TIMES = {"type": "object", "additionalProperties": {  # the runner's stage_times.json, by stage name
    "type": "object", "properties": {"seconds": NUMBER, "unfinished": NUMBER, "running": NUMBER,
                                     "cpus": {"type": "array", "items": {"type": "string"}}}}}
INVOCATIONS = {"type": "array", "items": {  # the runner's invocations.json: each command that ran stages
    "type": "object", "properties": {"seconds": NUMBER, "last_beat_seconds": NUMBER, "command": {"type": ["string", "null"]},
                                     "cpu": {"type": "string"}}}}
GRAD_VARIANCE = {  # aria.experiment.runner's gradient-variance stage (scripts/grad_variance.py): what the table reads
    "type": "object", "required": ["samples", "games", "games_won", "methods",
                                   *(f"{m}_{k}" for k in ("raw_step_return", "aggregated_reward") for m in ("reward_variance", "trace_cov"))],
    "properties": {"samples": {"type": "integer"}, "games": {"type": "integer"}, "games_won": {"type": "integer"},
                   "methods": {"type": "array", "items": {"type": "string"}}},
    "patternProperties": {"^(reward_variance|trace_cov)_": NUMBER, "^snr_": MAYBE_NUMBER}}
BEHAVIOUR_CURVES = ("ari", "nmi", "mse", "bias_squared", "variance_within")  # one value a k of ``ks``
CURVE = {"type": "array", "items": NUMBER}  # one value a k of ``ks`` (read_selection checks the length)
SELECTION = {  # step 2's selection.json: the chosen k, the ks, the intention recovery and behaviour sections
    "type": "object", "required": ["chosen", "ks", "num_steps"],
    "properties": {"chosen": {"type": "object", "required": ["k"], "properties": {"k": K_PER_POOL}},
                   "ks": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                   "num_steps": {"type": "integer"},
                   "intention_recovery": {"type": ["object", "null"], "required": ["steps", "intentions", "ari", "nmi"],
                                          "properties": {"steps": {"type": "integer"}, "intentions": {"type": "integer"},
                                                         "ari": CURVE, "nmi": CURVE}},
                   "behaviour": {"type": ["object", "null"],
                                 "properties": {"step_intentions": {"type": "integer"},
                                                **{name: CURVE for name in BEHAVIOUR_CURVES}},
                                 "dependentRequired": {"mse": ["step_intentions", *BEHAVIOUR_CURVES]}}}}


def read_checked(path: Path, schema: dict) -> Any:
    """``path``'s JSON, checked against ``schema``: its first problem is a :class:`DataError` naming the field."""
    found = read_json(path)
    problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(found))
    if problem is None:
        return found
    where = problem.json_path.removeprefix("$").removeprefix(".")
    if problem.validator == "required":  # named as every reader names a missing field
        missing = next(name for name in problem.validator_value if name not in problem.instance)
        raise DataError(path, None, f"{where}.{missing}".removeprefix("."), "missing")
    raise DataError(path, None, where or None, problem.message)


def read_selection(path: Path) -> dict[str, Any]:
    """A labelling's selection.json (:data:`SELECTION`), each behaviour curve one value a k of ``ks``."""
    s = read_checked(path, SELECTION)
    for section, names in (("behaviour", BEHAVIOUR_CURVES), ("intention_recovery", ("ari", "nmi"))):
        for name in names:
            if name in (s.get(section) or {}) and len(s[section][name]) != len(s["ks"]):
                raise DataError(path, None, f"{section}.{name}", f"{len(s[section][name])} values for the {len(s['ks'])} ks")
    for pool, k in s["chosen"]["k"].items():  # step 2 chooses among the ks it clustered
        if k not in s["ks"]:
            raise DataError(path, None, f"chosen.k.{pool}", f"{k} is not among the ks clustered ({s['ks'][0]}..{s['ks'][-1]})")
    return s


# ---- the evaluations: only what the runner would count ------------------------------------------------------
def evaluation_ids(cfg: ExperimentSettings) -> set[str]:
    """The game ids of one arm's evaluation under the settings (``eval``): game ``i`` of the
    evaluation seed for ``i < eval.games``, or of every configuration of ``eval.config_set``."""
    return family_of(cfg.game).evaluation_ids(cfg)


class EvaluationReader:
    """A run's evaluation files, each read only as the runner would count it. The runner plays an
    evaluation again whenever its producer record differs from what the arm's model and the settings
    make; a run folder edited or assembled by hand (an arm's file copied from another arm, seat or
    run, a record or marker removed) would otherwise be reported as the arm's games. So each file
    must have its producer record; it must name the evaluation seed and, in the policy's seat, the
    model the arm evaluates (the run's own: its path and the version its ``trained_on.json`` gives;
    the base model: no model of the run); every file of a seat must share the record but for that
    model (paired games are played under one set of conditions; comparing across arms, not against
    this code's record, lets a report of an older run read it as it ran); and a game id must hold
    the same target in every file. The first problem is a :class:`DataError` naming the file and field."""

    def __init__(self, cfg: ExperimentSettings, lay: Layout):
        self.cfg, self.lay, self.family = cfg, lay, lay.family
        self.expected = evaluation_ids(cfg)
        self.conditions: dict[str | None, tuple[Path, dict]] = {}  # seat -> the first file's record, its model left out
        self.targets: dict[str, tuple[Any, Path]] = {}  # game id -> its target and the file that first held it

    def outcomes(self, method: str, seed: int, iteration: int) -> dict[str, dict] | None:
        """An arm's evaluation games as ``{pair key: {"success", "score", "deal", "turns"}}``, or None
        until every game of :func:`evaluation_ids` is played in every seat. Only those count: a file
        that holds more (an evaluation since lowered from more games) reports the games the settings
        name, so a table always agrees with its header. success = the policy won (a question game:
        found the target), turns = the policy's own. A question game's games are keyed by game id; a
        two-player game's (one file a seat) by seat and game id, so arms pair by configuration and
        seat. score = the policy's graded outcome (a two-player game's payoff share; a question game's
        success); deal = a two-player game ended in a deal (else None)."""
        out = {}
        for file, role in self.family.evaluation_seats(self.lay.evaluation(method, seed, iteration)):
            if not file.is_file():
                return None
            self.check_producer(file, role, method, seed, iteration)
            records = read_trajectories(file, allow_partial_last_line=True)
            games = {r["game_id"]: r for r in records if r.get("status") != "failed" and r["game_id"] in self.expected}
            if len(games) < len(self.expected):
                return None
            for gid, r in games.items():
                out[f"{role}:{gid}" if role else gid] = self.outcome(file, r, role)
        return out

    def outcome(self, file: Path, record: dict, role: str | None) -> dict[str, Any]:
        gid, target = record["game_id"], record.get("target")
        first = self.targets.setdefault(gid, (target, file))
        if first[0] != target:
            raise DataError(file, None, f"game {gid}: target", f"{target!r}, where {first[1]} holds {first[0]!r} for the same "
                                                               f"game: paired games must share their target")
        try:
            return {"success": self.family.won(record, role), "score": self.family.score(record, role),
                    "deal": record["meta"]["outcome"] == "deal" if role else None, "turns": self.family.turns(record, role)}
        except (KeyError, TypeError, ValueError) as err:  # a record edited by hand: its game named, not a traceback
            raise DataError(file, None, f"game {gid}", f"its outcome cannot be read ({type(err).__name__}: {err})") from None

    def check_producer(self, file: Path, role: str | None, method: str, seed: int, iteration: int) -> None:
        """The file's producer record against the arm's model and the seat's other files (class doc)."""
        where, redo = producer_path(file), "remove the file and resume the run to play these games again"
        producer = read_producer(file)
        if producer is None:
            raise DataError(where, None, None, f"missing: nothing says which model played {file.name} (the runner "
                                               f"plays an evaluation without one again); {redo}")
        if producer.get("seed") != self.cfg.eval.seed:
            raise DataError(where, None, "producer.seed", f"games of evaluation seed {producer.get('seed')!r}, not the run's "
                                                          f"{self.cfg.eval.seed}: {redo}")
        key, player = self.family.player_in(producer, role)
        if not isinstance(player, dict) or "model_path" not in player:
            raise DataError(where, None, f"producer.{key}", f"{player!r} plays the policy's seat, not a model: {redo}")
        recorded = str(player["model_path"])
        if iteration == 0 and not self.cfg.warm_start.enabled:  # the base model: its path is the machine's, never the run's
            if not Path(recorded).is_absolute():
                raise DataError(where, None, f"producer.{key}.model_path", f"games of {recorded}, a model of this run, "
                                                                           f"not the base model: {redo}")
        else:
            self.check_model(where, f"producer.{key}", player, method, seed, iteration, redo)
        conditions = {**producer, **({"policy": {**player, "model_path": None, "model_version": None}} if role is None else
                                     {"seats": {**producer["seats"], role: {**player, "model_path": None, "model_version": None}}})}
        first = self.conditions.setdefault(role, (where, conditions))
        changed = differences(first[1], conditions)
        if changed:
            field, _, change = changed[0].partition(" was ")
            raise DataError(where, None, f"producer.{field}", f"was {change} in {first[0]}: games of one comparison are "
                                                              f"played under one set of conditions; {redo}")

    def check_model(self, where: Path, key: str, player: dict, method: str, seed: int, iteration: int, redo: str) -> None:
        """The policy's model is the arm's (its path in the run) at the version its training marker gives."""
        model = self.lay.model(method, seed, iteration)
        path, recorded = recorded_path(self.cfg, model), str(player["model_path"])
        parts = Path(path).parts
        if Path(recorded).parts[-len(parts):] != parts:  # (older runs recorded absolute paths)
            raise DataError(where, None, f"{key}.model_path", f"games of {recorded}, not of {path}, the model this "
                                                              f"evaluation is of: {redo}")
        if not (model.parent / "trained_on.json").is_file():
            raise DataError(model.parent / "trained_on.json", None, None, f"missing: nothing says which training made "
                                                                          f"{path}, whose games {where.name} holds")
        if player.get("model_version") != model_version(model):
            raise DataError(where, None, f"{key}.model_version",
                            f"games of {path} as version {player.get('model_version')} trained it, not as its "
                            f"trained_on.json beside it says (version {model_version(model)}): {redo}")


def read_evaluations(cfg: ExperimentSettings, lay: Layout) -> tuple[dict | None, dict[tuple[str, int, int], dict[str, dict]]]:
    """The starting model's evaluation (None until it is finished), and each finished evaluation's
    games by id under (method, seed, iteration), the starting model's as iteration 0 of every arm
    (each file checked: :class:`EvaluationReader`)."""
    reader, evaluations = EvaluationReader(cfg, lay), {}
    base_games = reader.outcomes("", 0, 0)
    for seed in cfg.seeds:
        for method in cfg.methods:
            if base_games is not None:
                evaluations[(method, seed, 0)] = base_games
            for it in range(1, iterations_of(cfg, method) + 1):
                games = reader.outcomes(method, seed, it)
                if games is not None:
                    evaluations[(method, seed, it)] = games
    return base_games, evaluations


# ---- an arm's lineage and movement: measured on its model, against its parent -------------------------------
def parent_model(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> Path | None:
    """The model an arm's iteration trained from, where it is the run's own (the warm start or the
    arm's previous iteration); None for the base model, whose path is the machine's."""
    return lay.model(method, seed, iteration - 1) if iteration > 1 or cfg.warm_start.enabled else None


def check_lineage(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> None:
    """The arm's training marker names the model its gain is measured against: an arm copied from a
    run of another warm start would be compared with this one's (found by a review)."""
    marker, parent = lay.model(method, seed, iteration).parent / "trained_on.json", parent_model(cfg, lay, method, seed, iteration)
    trained_on = read_json(marker)
    if not isinstance(trained_on, dict):
        raise DataError(marker, None, None, "expected an object (what the arm was trained on)")
    check_parent(cfg, marker, "start_model", trained_on.get("start_model"), trained_on.get("start_model_version"), parent,
                 "trained from")


def read_movement(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> dict[str, Any] | None:
    """An arm's movement measures (its ``movement.json`` without the key, the key checked), or None
    until they are measured."""
    path = lay.movement(method, seed, iteration)
    if not path.is_file():
        return None
    m = read_checked(path, MOVEMENT)
    check_movement_key(cfg, lay, path, m.pop("key"), method, seed, iteration)
    if "token_kl_ci95" in m and m["token_kl_ci95"][0] > m["token_kl_ci95"][1]:  # the rule reads its lower end
        raise DataError(path, None, "token_kl_ci95", f"{m['token_kl_ci95']}: the lower end above the upper")
    return m


def check_movement_key(cfg: ExperimentSettings, lay: Layout, path: Path, key: dict, method: str, seed: int, iteration: int) -> None:
    """A movement file measured the arm's model against its parent, at the preset's steps (the
    runner measures again whenever its key differs); the precision and held-out steps it names are
    the machine's and the data's, which the run folder alone cannot redo."""
    model, redo = lay.model(method, seed, iteration), "remove the file and resume the run to measure it again"
    if key["child_version"] != model_version(model):  # measured on another arm's model, or an older training
        raise DataError(path, None, "key.child_version",
                        f"measured on the model version {key['child_version']} trained, not {recorded_path(cfg, model)} as "
                        f"its trained_on.json beside it says (version {model_version(model)}): {redo}")
    if "steps" in key and key["steps"] != cfg.report.movement.steps:
        raise DataError(path, None, "key.steps", f"measured on {key['steps']} steps, not report.movement.steps = "
                                                 f"{cfg.report.movement.steps}: {redo}")
    check_parent(cfg, path, "key.parent", key["parent"], key["parent_version"], parent_model(cfg, lay, method, seed, iteration),
                 "measured against")


def check_parent(cfg: ExperimentSettings, where: Path, field: str, recorded: Any, version: Any, parent: Path | None, what: str) -> None:
    """``recorded`` (a path as the run records it) and ``version`` name ``parent`` (the run's own
    model), or, where the parent is the base model (None), no model of the run."""
    if parent is None:
        if isinstance(recorded, str) and not Path(recorded).is_absolute():
            raise DataError(where, None, field, f"{what} {recorded}, a model of this run, not the base model")
        return
    path = recorded_path(cfg, parent)
    parts = Path(path).parts
    if not isinstance(recorded, str) or Path(recorded).parts[-len(parts):] != parts:
        raise DataError(where, None, field, f"{what} {recorded!r}, not {path}")
    if (parent.parent / "trained_on.json").is_file() and version != model_version(parent):
        raise DataError(where, None, f"{field}_version", f"{what} {path} as version {version!r} trained it, not as its "
                                                         f"trained_on.json says (version {model_version(parent)})")


# ---- the labellings' and the gradient stage's files -----------------------------------------------------
def read_preflights(cfg: ExperimentSettings, lay: Layout) -> tuple[dict[str, dict], dict[str, dict]]:
    """Each collection's pre-flight, and its clusters against the behavioural intentions, by collection."""
    preflight, behaviour = {}, {}
    for seed in cfg.seeds:
        for method in cfg.methods:
            for it in range(1, iterations_of(cfg, method) + 1):
                where = lay.intention(method, seed, it) / "preflight.json"
                shared = where == lay.intention("", seed, it) / "preflight.json"
                name = f"seed {seed}, iteration 1 (shared)" if shared else f"seed {seed}, {method}, iteration {it}"
                if where.is_file() and name not in preflight:
                    preflight[name] = read_checked(where, PREFLIGHT)
                    against = behaviour_at_chosen_k(where.parent / "selection.json")
                    if against:
                        behaviour[name] = against
    return preflight, behaviour


def behaviour_at_chosen_k(selection_path: Path) -> dict | None:
    """A collection's clusters against its behavioural intentions (step 2's ``behaviour``
    section) at the chosen k, and the k whose R~ is closest to the behavioural R~."""
    if not selection_path.is_file():
        return None
    s = read_selection(selection_path)
    b = s.get("behaviour")
    if not b or "mse" not in b or len(set(s["chosen"]["k"].values())) != 1:
        return None
    ks, k = s["ks"], next(iter(s["chosen"]["k"].values()))
    at, best = ks.index(k), min(range(len(ks)), key=lambda i: b["mse"][i])
    pick = lambda i: {name: b[name][i] for name in ("ari", "nmi", "mse", "bias_squared", "variance_within")}  # noqa: E731
    return {"intentions": b["step_intentions"], "steps": s["num_steps"], "chosen_k": k, "at_chosen_k": pick(at),
            "closest_k": ks[best], "at_closest_k": pick(best)}


def read_recovery(lay: Layout) -> dict[str, Any] | None:
    """Intention recovery on the expert's games (the warm start's labelling), if it ran."""
    selection = lay.warm / "intention" / "selection.json"
    if not selection.is_file():
        return None
    s = read_selection(selection)
    return {"chosen_k": s["chosen"]["k"], "ks": s["ks"], **(s.get("intention_recovery") or {})}


def read_gradient_variance(cfg: ExperimentSettings, lay: Layout) -> dict[str, dict]:
    """Each seed's gradient-variance stage, by seed."""
    variance = {}
    for seed in cfg.seeds:
        path = lay.shared(seed) / "grad_variance.json"
        if path.is_file():
            found = read_checked(path, GRAD_VARIANCE)
            for kind in [f"method_{m}" for m in found["methods"]]:  # each method's row, as the table reads it
                for measure in ("reward_variance", "trace_cov"):
                    if not isinstance(found.get(f"{measure}_{kind}"), (int, float)):
                        raise DataError(path, None, f"{measure}_{kind}", "missing" if f"{measure}_{kind}" not in found
                                        else f"{found[f'{measure}_{kind}']!r} is not a number")
            variance[str(seed)] = {k: v for k, v in found.items() if k != "key"}
    return variance
