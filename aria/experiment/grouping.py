"""Grouping schemes side by side on one labelled collection: which steps each scheme lets share a
reward estimate, and at what cost.

Every scheme groups the same agent steps of a collection whose pipeline steps 1-4 ran:
=========================  =====================================================================
``aria``                   (history, action) keys over the whole history, step 1's clusters at the
                           chosen k: the paper's ARIA.
``aria_window{m}``         the same clusters, keys of the last m turns (``aggregation.window``; ours).
``aria_behavioural``       whole-history keys over the behavioural intentions (behaviour.json): the
                           ceiling any clustering can reach.
``aria_behavioural_window{m}``  both.
``gigpo``                  GiGPO's anchor states: equal histories among the games of one target
                           (Feng et al. 2025, verl-agent ``build_step_group``).
``gigpo_similar``          GiGPO's similarity mode: histories whose ``difflib`` ratio reaches the
                           threshold (verl-agent ``enable_similarity``, 0.9 in its scripts).
``no_aggregation``         no group: every step alone with its own return R_t (the ablation).
=========================  =====================================================================

For each: the share of steps in a group of two or more, by turn (a step alone gets its own
return, so the scheme changes nothing for it), the mean group size, and the group mean of the
returns against the returns (mean |change|, Var ratio), and how much of the games' outcome each
weighting keeps (:func:`outcome_signal`: its correlation with the game's final reward, and its value
on the last step of each won game, where R_t is the game's reward itself). For the (history, action) schemes also
how far their R̃ (the ablation's: R_t) is from R̃ under the behavioural intentions with whole-history keys, as bias² +
variance within (:func:`aria.intention.aggregate.error_against`). GiGPO's groups are states, not
(state, action) pairs: their mean is a baseline V(s), not an estimate of R̃, so it gets no such
figure. The gradient signal-to-noise ratio of each weighting needs the policy's per-sample
gradients: :func:`compare` leaves it to :func:`aria.trainers.grad_variance.gradient_variance`
(``weightings``: its ``sample_weights``, each (history, action) scheme's R̃ and GiGPO's similarity
advantages at the threshold, one per sample of train.json in its order), which ``scripts/grouping_schemes.py --model`` calls: the plug-in SNR, the
SNR less its bias (about 1/n: a gradient of pure noise reads 1/(n−1)) with a bootstrap interval,
and its difference from the raw return's (the same resamples for every scheme).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aria.data import read_training_set
from aria.intention import pipeline
from aria.intention.aggregate import errors_against, group_mean, group_sharing, step_keys
from aria.io import DataError
from aria.resources import compose_config
from aria.trainers.methods import gigpo_groups, method_weights


def run_config(run_dir: str | Path) -> dict:
    """The pipeline config a labelled run was made under, rebuilt from its own outputs: the game,
    embedding and behaviour settings step 1 recorded (runs from before it recorded them: the game's
    defaults, which :func:`compare` then checks against step 4's fingerprint), the input files,
    the aggregation settings and the labels step 2 and 3 ran under. Values are set after composing,
    so no path is parsed as a Hydra override (a comma in a folder's name)."""
    run_dir = Path(run_dir)
    summary = pipeline.step_output(run_dir / "utterances.json", 1)
    selection = pipeline.step_output(run_dir / "selection.json", 2)
    if not summary.get("inputs"):
        raise pipeline.StaleStep(1, f"{run_dir / 'utterances.json'} names no inputs: not a complete output")
    if not selection.get("settings"):
        raise pipeline.StaleStep(2, f"{run_dir / 'selection.json'} names no settings: not a complete output")
    cfg = compose_config("intention", [f"game={summary['game']}"])
    cfg.update(summary.get("made_under") or {})
    cfg["input"], cfg["run_dir"] = list(summary["inputs"]), str(run_dir)
    cfg["aggregation"] = {**cfg["aggregation"], **selection["settings"]["aggregation"]}
    cfg["labels"] = selection.get("labels") or pipeline.step3_labels(run_dir, selection, cfg["labels"])
    return cfg


def won_last_steps(corpus, table, in_order: list[dict]) -> np.ndarray:
    """Per step: whether it is the last step of its player in a won game (the winning guess)."""
    won_last = np.zeros(table.num_steps, dtype=bool)
    last: dict[tuple[int, int], int] = {}
    for step, (g, role, t) in enumerate(zip(corpus.step_game.tolist(), table.step_role.tolist(), corpus.step_turn.tolist())):
        if (g, role) not in last or t > corpus.step_turn[last[(g, role)]]:
            last[(g, role)] = step
    won_last[[step for step in last.values() if in_order[step]["success"]]] = True
    return won_last


def sample_of_each_step(samples: list[dict], corpus) -> list[int]:
    """For each step of the corpus, the index of its sample in the training set (game id and turn)."""
    position = {(s["game_id"], int(s["turn"])): i for i, s in enumerate(samples)}
    return [position[(corpus.game_ids[g], int(t))] for g, t in zip(corpus.step_game.tolist(), corpus.step_turn.tolist())]


def in_training_order(by_step: dict[str, np.ndarray], order: list[int], samples: int) -> dict[str, list[float]]:
    """Per-step values put back in the training set's order (``order[step]`` is the step's sample)."""
    out = {name: [float("nan")] * samples for name in by_step}
    for step, i in enumerate(order):
        for name, values in by_step.items():
            out[name][i] = float(values[step])
    return out


def compare(cfg: dict, window: int = 2, threshold: float = 0.9) -> dict:
    """The grouping schemes of the module doc on the run of ``cfg`` (steps 1-4 done)."""
    # train.json first: step 4's output of this run's labels under these game settings, checked before
    # anything here is computed or cached (behaviour.json) under settings the run did not have
    train = pipeline.check_training_set(cfg)
    run = pipeline.read_labelled_run(cfg)
    run_dir, corpus, chosen = run.run_dir, run.corpus, run.chosen
    clusters = run.labels_at(chosen)
    behaviour = pipeline.behavioural_labels(cfg, corpus, lambda line: None)
    exact = corpus.utterance_labels(behaviour) if behaviour is not None else None
    table, returns = corpus.table, corpus.table.step_return

    schemes: dict[str, tuple[np.ndarray, str]] = {
        "aria": (step_keys(table, clusters)[0], "history+action"),
        f"aria_window{window}": (step_keys(table, clusters, window)[0], "history+action")}
    if exact is not None:
        schemes["aria_behavioural"] = (step_keys(table, exact)[0], "history+action")
        schemes[f"aria_behavioural_window{window}"] = (step_keys(table, exact, window)[0], "history+action")

    # GiGPO groups the training set's samples (their rendered histories): line them up with the steps.
    samples = read_training_set(train)
    order = sample_of_each_step(samples, corpus)
    in_order = [samples[i] for i in order]
    schemes["gigpo"] = (gigpo_groups(in_order)[1], "state")
    try:  # the advantages of both modes (gigpo_similar's at this threshold: the method's own default is 0.9)
        exact_weights = method_weights("gigpo", samples)
        similar_weights = method_weights("gigpo_similar", samples, threshold=threshold)
    except KeyError as error:
        raise DataError(train, None, None, error.args[0]) from None
    # the groups those advantages were computed on: similarity groups depend on the order the states
    # come in (each joins the first group it is similar to), so the training set's order, then the steps'
    schemes["gigpo_similar"] = (gigpo_groups(samples, threshold)[1][order], "state")

    # the ablation: every step alone, its reward R_t itself (all of its distance from the ceiling is
    # variance within the ceiling's keys)
    schemes["no_aggregation"] = (np.arange(table.num_steps), "none")

    # R~ of each (history, action) scheme: the mean return of its group (GiGPO's groups are states)
    reward_of = {name: group_mean(groups, returns)[0] for name, (groups, kind) in schemes.items() if kind == "history+action"}
    compared = {**reward_of, "no_aggregation": np.asarray(returns, dtype=np.float64)}
    errors = dict(zip(compared, errors_against(table, compared.values(), exact))) if exact is not None else {}
    rows = {name: {"groups": kind, **group_sharing(groups, returns, corpus.step_turn), **errors.get(name, {})}
            for name, (groups, kind) in schemes.items()}
    # Does each weighting still tell the steps of won games from those of lost ones? R_t does almost
    # perfectly (γ^(T−t) times the game's reward); a group mean over steps of won and lost games blurs
    # it, and on a won game's last step (the winning guess) it is what the group's other steps earned.
    outcome = np.array([float(s["final_reward"]) for s in in_order])
    won_last = won_last_steps(corpus, table, in_order)
    weights_by_step = {**compared, "gigpo": exact_weights[order], "gigpo_similar": similar_weights[order]}
    for name, weights in weights_by_step.items():
        rows[name].update(outcome_signal(weights, outcome, won_last if name in compared else None))
    sample_weights = {**in_training_order(reward_of, order, len(samples)), "gigpo_similar": similar_weights.tolist()}
    return {"run_dir": str(run_dir), "game": run.summary["game"], "steps": int(table.num_steps), "games": len(corpus.game_ids),
            "chosen_k": chosen, "behavioural_intentions": None if behaviour is None else
            {p: int(len(np.unique(v))) for p, v in behaviour.items()}, "window": window, "similarity_threshold": threshold,
            "schemes": rows, "sample_weights": sample_weights}


def outcome_signal(weights: np.ndarray, outcome: np.ndarray, won_last: np.ndarray | None) -> dict:
    """How much of the games' outcome a weighting keeps: the Pearson correlation of each step's
    weight with its game's final reward (None where either is constant), and, for weights in return
    units (``won_last``: the last step of each won game), their mean on those steps, where R_t is
    the game's reward itself (1 in a question game)."""
    weights, outcome = np.asarray(weights, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    varies = weights.std() > 0 and outcome.std() > 0
    return {"outcome_correlation": float(np.corrcoef(weights, outcome)[0, 1]) if varies else None,
            "won_last_step": float(weights[won_last].mean()) if won_last is not None and won_last.any() else None}


def markdown(found: dict) -> str:
    """The comparison as a table (one row per scheme)."""
    lines = [f"Grouping schemes on {found['games']} games, {found['steps']} steps of {found['game']} "
             f"(clusters at k = {found['chosen_k']}; behavioural intentions {found['behavioural_intentions']}):", "",
             "| scheme | groups | steps sharing | by turn | mean group size | Var(group mean)/Var(R) | bias² | variance within "
             "| corr(weight, outcome) | weight on won games' last step "
             "| SNR (plug-in) | SNR × 1000, bias-corrected (95% CI) | its difference from R's (95% CI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(v, spec):  # a sum of squares that cancels exactly prints as 0, not as 5e-34
        return "–" if v is None else "0" if abs(v) < 1e-15 else format(v, spec)

    def per_mille(v, ci):  # with the bootstrap's interval where scripts/grouping_schemes.py made one
        if v is None:
            return "–"
        return f"{1000 * v:.2f}" + (f" ({1000 * ci[0]:.2f} to {1000 * ci[1]:.2f})" if ci else "")

    for name, r in found["schemes"].items():
        turns = ", ".join(f"{t}: {100 * v:.0f}%" for t, v in r["shared_by_turn"].items())
        lines.append(f"| {name} | {r['groups']} | {100 * r['shared']:.1f}% | {turns} | {r['mean_group_size']:.2f} | "
                     f"{fmt(r['variance_ratio'], '.3f')} | {fmt(r.get('bias_squared'), '.4g')} | "
                     f"{fmt(r.get('variance_within'), '.4g')} | {fmt(r.get('outcome_correlation'), '.3f')} | "
                     f"{fmt(r.get('won_last_step'), '.3f')} | {fmt(r.get('snr'), '.4g')} | "
                     f"{per_mille(r.get('snr_corrected'), r.get('snr_corrected_ci95'))} | "
                     f"{per_mille(r.get('snr_difference'), r.get('snr_difference_ci95'))} |")
    return "\n".join(lines) + "\n"
