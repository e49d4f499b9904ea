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

from aria.experiment.layout import Layout, iterations_of, model_version, recorded_path, seeds_of
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
    "type": "object", "required": ["token_kl", "logprob_change_won", "logprob_change_lost", "weights"],
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
class SetAside(Exception):
    """A file the runner would not take as it stands: when the run resumes it plays, trains or
    measures that work again. The report leaves it out of its tables and names it with the reason,
    as it names work not done yet: a run in progress passes through such states (a stage retraining
    an arm, evaluations replayed on a machine that serves another precision), and a folder edited or
    assembled by hand shows them. Damage the runner cannot repair either stays a :class:`DataError`."""

    def __init__(self, path: Path, field: str | None, reason: str):
        super().__init__(f"{path}" + (f", field '{field}'" if field else "") + f": {reason}")
        self.path, self.field, self.reason = path, field, reason

    def record(self, cfg: ExperimentSettings, what: Path) -> dict[str, Any]:
        """What results.json says of it: the work set aside (a path in the run), the file, the field, why."""
        return {"what": recorded_path(cfg, what), "file": recorded_path(cfg, self.path), "field": self.field, "reason": self.reason}


def evaluation_ids(cfg: ExperimentSettings) -> set[str]:
    """The game ids of one arm's evaluation under the settings (``eval``): game ``i`` of the
    evaluation seed for ``i < eval.games``, or of every configuration of ``eval.config_set``."""
    return family_of(cfg.game).evaluation_ids(cfg)


class EvaluationReader:
    """A run's evaluations, each counted only as the runner would count it. The runner plays an
    evaluation again whenever its producer record differs from what the arm's model and the settings
    make, and trains an arm again whenever its marker differs; a run folder edited or assembled by
    hand (an arm's file copied from another arm, seat or run, a record or marker removed) would
    otherwise be reported as the arm's games. So an evaluation is :class:`SetAside` (left out, named
    in ``set_aside``) unless its arm's marker names its parent (:func:`check_lineage`) and each of its
    files has a producer record naming the evaluation seed and, in the policy's seat, the model the
    arm evaluates (the run's own: its path and the version its ``trained_on.json`` gives; the base
    model: no model of the run); every file of a seat shares the record of the first one counted
    but for that model (paired games are played under one set of conditions; comparing across
    arms, not against this code's record, lets a report of an older run read it as it ran); and a
    game id holds the same target in every file."""

    def __init__(self, cfg: ExperimentSettings, lay: Layout):
        self.cfg, self.lay, self.family = cfg, lay, lay.family
        self.expected = evaluation_ids(cfg)
        self.conditions: dict[str | None, tuple[Path, dict]] = {}  # seat -> the first counted file's record, its model left out
        self.targets: dict[str, tuple[Any, Path]] = {}  # game id -> its target and the file that first held it
        self.set_aside: list[dict[str, Any]] = []

    def outcomes(self, method: str, seed: int, iteration: int) -> dict[str, dict] | None:
        """An arm's evaluation games as ``{pair key: {"success", "score", "deal", "turns"}}``, or None
        until every game of :func:`evaluation_ids` is played in every seat (or while it is set aside).
        Only those count: a file that holds more (an evaluation since lowered from more games)
        reports the games the settings name, so a table always agrees with its header. success = the
        policy won (a question game: found the target), turns = the policy's own. A question game's
        games are keyed by game id; a two-player game's (one file a seat) by seat and game id, so
        arms pair by configuration and seat. score = the policy's graded outcome (a two-player game's
        payoff share; a question game's success); deal = a two-player game ended in a deal (else None)."""
        where = self.lay.evaluation(method, seed, iteration)
        seats = self.family.evaluation_seats(where)
        if not all(file.is_file() for file, _ in seats):
            return None
        try:
            if iteration > 0:
                check_lineage(self.cfg, self.lay, method, seed, iteration)
            found, conditions = [], {}
            for file, role in seats:
                conditions[role] = self.check_producer(file, role, method, seed, iteration)
                records = read_trajectories(file, allow_partial_last_line=True)
                games = {r["game_id"]: r for r in records if r.get("status") != "failed" and r["game_id"] in self.expected}
                if len(games) < len(self.expected):
                    return None
                self.check_targets(file, games)
                found.append((file, role, games))
        except SetAside as why:
            self.set_aside.append(why.record(self.cfg, where))
            return None
        for role, (file, record) in conditions.items():  # counted: the reference for the files after it
            self.conditions.setdefault(role, (file, record))
        out = {}
        for file, role, games in found:
            for gid, r in games.items():
                self.targets.setdefault(gid, (r.get("target"), file))
                out[f"{role}:{gid}" if role else gid] = self.outcome(file, r, role)
        return out

    def check_targets(self, file: Path, games: dict[str, dict]) -> None:
        for gid, r in games.items():
            first = self.targets.get(gid)
            if first is not None and first[0] != r.get("target"):
                raise SetAside(file, f"game {gid}: target", f"{r.get('target')!r}, where {first[1]} holds {first[0]!r} "
                                                              f"for the same game: paired games share their target")

    def outcome(self, file: Path, record: dict, role: str | None) -> dict[str, Any]:
        try:
            return {"success": self.family.won(record, role), "score": self.family.score(record, role),
                    "deal": record["meta"]["outcome"] == "deal" if role else None, "turns": self.family.turns(record, role)}
        except (KeyError, TypeError, ValueError) as err:  # a record edited by hand: its game named, not a traceback
            raise DataError(file, None, f"game {record['game_id']}", f"its outcome cannot be read ({type(err).__name__}: {err})") from None

    def check_producer(self, file: Path, role: str | None, method: str, seed: int, iteration: int) -> tuple[Path, dict]:
        """The file's producer record against the arm's model and the seat's counted files (class
        doc); returns the file and its record with the model left out, the conditions it was played under."""
        where, again = producer_path(file), "the runner plays these games again"
        producer = read_producer(file)
        if producer is None:
            raise SetAside(where, None, f"missing: nothing says which model played {file.name}; {again}")
        if producer.get("seed") != self.cfg.eval.seed:
            raise SetAside(where, "producer.seed", f"games of evaluation seed {producer.get('seed')!r}, not the run's "
                                                   f"{self.cfg.eval.seed}; {again}")
        key, player = self.family.player_in(producer, role)
        if not isinstance(player, dict) or "model_path" not in player:
            raise SetAside(where, f"producer.{key}", f"{player!r} plays the policy's seat, not a model; {again}")
        recorded = str(player["model_path"])
        if iteration == 0 and not self.cfg.warm_start.enabled:  # the base model: its path is the machine's, never the run's
            if self.lay.holds_model(recorded):
                raise SetAside(where, f"producer.{key}.model_path", f"games of {recorded}, a model of this run, not the "
                                                                     f"base model; {again}")
        else:
            check_model(self.cfg, self.lay.model(method, seed, iteration), where, f"producer.{key}", player, again)
        conditions = {**producer, **({"policy": {**player, "model_path": None, "model_version": None}} if role is None else
                                     {"seats": {**producer["seats"], role: {**player, "model_path": None, "model_version": None}}})}
        first = self.conditions.get(role)
        changed = differences(first[1], conditions) if first else []
        if changed:
            field, _, change = changed[0].partition(" was ")
            counted, here = change.split(", now ", 1)
            raise SetAside(where, f"producer.{field}", f"{here} here, {counted} in {first[0]}: a comparison's games are "
                                                       f"played under one set of conditions; {again}")
        return where, conditions


def names(recorded: str, path: str) -> bool:
    """Whether ``recorded`` (a model's path in a record) names ``path`` (relative to the run folder):
    the same path, or one ending in it (older runs recorded absolute paths)."""
    parts = Path(path).parts
    return Path(recorded).parts[-len(parts):] == parts


def check_model(cfg: ExperimentSettings, model: Path, where: Path, key: str, player: dict, again: str) -> None:
    """The policy's model in a producer record is ``model`` (its path in the run) at the version its
    training marker gives."""
    path, recorded = recorded_path(cfg, model), str(player["model_path"])
    if not names(recorded, path):
        raise SetAside(where, f"{key}.model_path", f"games of {recorded}, not of {path}, the model this evaluation is of; {again}")
    if not (model.parent / "trained_on.json").is_file():
        raise SetAside(model.parent / "trained_on.json", None, f"missing: nothing says which training made {path}; "
                                                               f"the runner trains it again")
    if player.get("model_version") != model_version(model):
        raise SetAside(where, f"{key}.model_version", f"games of {path} as version {player.get('model_version')} trained it, "
                                                      f"not as its trained_on.json says (version {model_version(model)}); {again}")


def read_evaluations(cfg: ExperimentSettings, lay: Layout) -> tuple[dict | None, dict[tuple[str, int, int], dict[str, dict]], list[dict]]:
    """The starting model's evaluation (None until it is finished), each finished evaluation's games
    by id under (method, seed, iteration), the starting model's as iteration 0 of every arm on its
    seeds, and the evaluations set aside (:class:`EvaluationReader`)."""
    reader, evaluations = EvaluationReader(cfg, lay), {}
    base_games = reader.outcomes("", 0, 0)
    for method in cfg.methods:
        for seed in seeds_of(cfg, method):
            if base_games is not None:
                evaluations[(method, seed, 0)] = base_games
            for it in range(1, iterations_of(cfg, method) + 1):
                games = reader.outcomes(method, seed, it)
                if games is not None:
                    evaluations[(method, seed, it)] = games
    return base_games, evaluations, reader.set_aside


# ---- an arm's lineage and movement: measured on its model, against its parent -------------------------------
def parent_model(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> Path | None:
    """The model an arm's iteration trained from, where it is the run's own (the warm start or the
    arm's previous iteration); None for the base model, whose path is the machine's."""
    return lay.model(method, seed, iteration - 1) if iteration > 1 or cfg.warm_start.enabled else None


def check_lineage(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> None:
    """The arm's training marker names the model its gain is measured against: an arm copied from a
    run of another warm start would be compared with this one's (found by a review)."""
    marker, parent = lay.model(method, seed, iteration).parent / "trained_on.json", parent_model(cfg, lay, method, seed, iteration)
    if not marker.is_file():
        raise SetAside(marker, None, "missing: nothing says what the arm was trained on; the runner trains it again")
    trained_on = read_json(marker)
    if not isinstance(trained_on, dict):
        raise DataError(marker, None, None, "expected an object (what the arm was trained on)")
    check_parent(cfg, lay, marker, "start_model", trained_on.get("start_model"), trained_on.get("start_model_version"), parent,
                 "trained from", "the runner trains the arm again")


def read_movement(cfg: ExperimentSettings, lay: Layout, method: str, seed: int, iteration: int) -> dict[str, Any] | None:
    """An arm's movement measures (its ``movement.json`` without the key, the key checked), or None
    until they are measured; :class:`SetAside` where the runner measures them again."""
    path = lay.movement(method, seed, iteration)
    if not path.is_file():
        return None
    m = read_checked(path, MOVEMENT)
    check_movement_key(cfg, lay, path, m.pop("key", None), method, seed, iteration)
    if "token_kl_ci95" in m and m["token_kl_ci95"][0] > m["token_kl_ci95"][1]:  # the rule reads its lower end
        raise DataError(path, None, "token_kl_ci95", f"{m['token_kl_ci95']}: the lower end above the upper")
    return m


def check_movement_key(cfg: ExperimentSettings, lay: Layout, path: Path, key: dict | None, method: str, seed: int,
                       iteration: int) -> None:
    """A movement file measured the arm's model against its parent, at the preset's steps (the
    runner measures again whenever its key differs); the precision and held-out steps it names are
    the machine's and the data's, which the run folder alone cannot redo."""
    model, again = lay.model(method, seed, iteration), "the runner measures it again"
    if key is None:
        raise SetAside(path, "key", f"missing: nothing says which models were measured; {again}")
    if key["child_version"] != model_version(model):  # measured on another arm's model, or an older training
        raise SetAside(path, "key.child_version", f"measured on the model version {key['child_version']} trained, not "
                                                  f"{recorded_path(cfg, model)} as its trained_on.json says (version "
                                                  f"{model_version(model)}); {again}")
    if "steps" in key and key["steps"] != cfg.report.movement.steps:
        raise SetAside(path, "key.steps", f"measured on {key['steps']} steps, not report.movement.steps = "
                                          f"{cfg.report.movement.steps}; {again}")
    check_parent(cfg, lay, path, "key.parent", key["parent"], key["parent_version"], parent_model(cfg, lay, method, seed, iteration),
                 "measured against", again)


def check_parent(cfg: ExperimentSettings, lay: Layout, where: Path, field: str, recorded: Any, version: Any, parent: Path | None,
                 what: str, again: str) -> None:
    """``recorded`` (a path as the run records it) and ``version`` name ``parent`` (the run's own
    model), or, where the parent is the base model (None), no model of the run."""
    if parent is None:
        if isinstance(recorded, str) and lay.holds_model(recorded):
            raise SetAside(where, field, f"{what} {recorded}, a model of this run, not the base model; {again}")
        return
    path = recorded_path(cfg, parent)
    if not isinstance(recorded, str) or not names(recorded, path):
        raise SetAside(where, field, f"{what} {recorded!r}, not {path}; {again}")
    if (parent.parent / "trained_on.json").is_file() and version != model_version(parent):
        raise SetAside(where, f"{field}_version", f"{what} {path} as version {version!r} trained it, not as its "
                                                  f"trained_on.json says (version {model_version(parent)}); {again}")


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
