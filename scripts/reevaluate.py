#!/usr/bin/env python3
"""Evaluate finished models again on an experiment's evaluation, with more games.

    python scripts/reevaluate.py --preset small --games 192 --run-dir RUN --out results/experiments/NAME \\
        warm=RUN_A/warm/model aria=RUN_A/s0/aria/it1/model ...

Each NAME=MODEL_DIR plays the preset's evaluation games (its targets, seed, sampling and engine;
``eval.games`` raised to ``--games``): the first games are the ones the experiment played, so
every model meets the same targets and any two are paired game by game. 48 games an arm leave a
95% interval about 30 points wide; this tightens it without training again. Transcripts go to
``RUN/NAME.jsonl`` (a re-run continues them); ``OUT/results.json`` records each model's per-game
outcomes, where it came from and the CPU, and is what docs render (aria/experiment/tables.py,
``reevaluated:NAME``). A model's provenance (which code trained it, on what) is given with
``--about NAME="text"``; ``--compare FIRST:SECOND`` names a paired comparison to show; ``--set
KEY=VALUE`` changes another setting of the experiment config (``engine=local``).
"""
import argparse
import sys
from pathlib import Path

from aria.cli import command, number, protect_terminal
from aria.experiment.layout import model_version
from aria.experiment.runner import GamesFailed, Generator, check_settings, evaluate_arm, evaluation_done
from aria.games.family import family_of
from aria.io import ConfigError, atomic_write_json, read_json
from aria.llm.hardware import describe, label
from aria.resources import compose_config
from aria.trajectories import read_trajectories


def pairs(values: list[str], what: str) -> dict[str, str]:
    """NAME=VALUE arguments as a dict; a malformed one is one line, exit 2."""
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise ConfigError(f"{what}: expected NAME=VALUE, got {value!r}")
        out[name] = rest
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="the experiment preset whose evaluation to play (config/experiment/)")
    parser.add_argument("--games", type=number(int, ge=1), required=True, help="games per model (the preset's first games, then more)")
    parser.add_argument("--run-dir", type=Path, required=True, help="where the transcripts go")
    parser.add_argument("--out", type=Path, required=True, help="the folder of results.json")
    parser.add_argument("--about", action="append", default=[], help="NAME=text: where a model came from")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another setting of the experiment config (engine=local, game.max_turns=5, ...)")
    parser.add_argument("--compare", action="append", default=[], help="FIRST:SECOND, a paired comparison the docs show")
    parser.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    args = parser.parse_args()
    with command(kept=lambda: f"the finished games in {args.run_dir} (a re-run continues them)"):
        models, about = pairs(args.models, "models"), pairs(args.about, "--about")
        compare = [tuple(c.split(":")) for c in args.compare]
        if any(len(c) != 2 or not set(c) <= set(models) for c in compare):
            raise ConfigError(f"--compare: expected FIRST:SECOND of the models ({', '.join(models)}), got {args.compare}")
        missing = [f"{name}={path}" for name, path in models.items() if not (Path(path) / "config.json").is_file()]
        if missing:
            raise ConfigError(f"models: no model folder (config.json) at {', '.join(missing)}")
        cfg = check_settings(compose_config("experiment", [f"experiment={args.preset}", f"run_dir={args.run_dir}",
                                                           f"results_dir={args.out}", *args.set, f"eval.games={args.games}"]))
        if family_of(cfg.game).kind != "question":
            raise ConfigError(f"--preset {args.preset}: reevaluation pairs question games by target; "
                              f"{cfg.game['name']} is a two-player game")
        args.run_dir.mkdir(parents=True, exist_ok=True)
        generator, e = Generator(cfg, print), cfg.eval
        try:
            for name, path in models.items():
                out = args.run_dir / f"{name}.jsonl"
                if not evaluation_done(cfg, out, generator.describe(Path(path), e, e.seed)):
                    generator.play(Path(path), e, e.seed, lambda policy: evaluate_arm(cfg, policy, out, print))
        except GamesFailed as failed:  # their records say why; exit 1, as the experiment does
            print(f"error: {failed}", file=sys.stderr)
            sys.exit(1)
        finally:
            generator.stop()
        results = {"preset": args.preset, "game": cfg.game["name"], "games": args.games,
                   "eval": {"seed": e.seed, "temperature": e.temperature, "max_tokens": e.max_tokens}, "engine": cfg.engine,
                   "cpu": label(describe()), "compare": [list(c) for c in compare], "models": []}
        for name, path in models.items():
            games = sorted((g for g in read_trajectories(args.run_dir / f"{name}.jsonl") if g.get("status") != "failed"),
                           key=lambda g: g["game_id"])[:args.games]
            trained_on = Path(path).parent / "trained_on.json"
            results["models"].append({
                "name": name, "about": about.get(name, ""), "model": str(path),
                "trained_on": read_json(trained_on) if trained_on.is_file() else None,
                "model_version": model_version(Path(path)),
                "game_ids": [g["game_id"] for g in games], "won": "".join("1" if g["success"] else "0" for g in games)})
            print(f"[reevaluate] {name}: {results['models'][-1]['won'].count('1')}/{len(games)} won")
        atomic_write_json(args.out / "results.json", results)
        print(f"[reevaluate] wrote {args.out / 'results.json'}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal
    main()
