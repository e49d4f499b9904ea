#!/usr/bin/env python3
"""How many behavioural intentions a file of question games holds (aria/intention/behaviour.py).

    python scripts/behavioural_intentions.py GAMES.jsonl [--game twenty_questions_subset]

Prints the outputs, distinct texts, behavioural intentions, and the share of questions that get
one answer for every target and win for none (they tell the policy nothing), answered by the
game's knowledge-base oracle. Failed games are skipped and counted, as pipeline step 1 does; a
file with no finished game is refused.
"""
import argparse
import json
import sys
import time
from collections import Counter
from aria.cli import protect_terminal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("games", help="a games file (JSON lines, schema v1) of a question game")
    parser.add_argument("--game", default="twenty_questions_subset", help="the game's config (config/game/)")
    args = parser.parse_args()

    from aria.cli import command
    from aria.games.common.base import load_game_config
    from aria.games.question.game import build_game
    from aria.games.question.oracle import build_oracle
    from aria.intention.behaviour import partition, signatures
    from aria.intention.pipeline import has_offline_oracle
    from aria.io import ConfigError, DataError
    from aria.trajectories import read_trajectories

    with command():
        cfg = load_game_config(args.game)
        if not has_offline_oracle(cfg):  # a two-player game, or a question game without a fact table
            raise ConfigError(f"--game: {args.game} has no offline oracle (facts_file) to compute behavioural intentions from")
        game, oracle = build_game(cfg), build_oracle({"name": "knowledge_base"}, cfg)
        every = list(read_trajectories(args.games, game=cfg["name"]))
        records = [r for r in every if r.get("status") != "failed"]  # the pipeline's corpus skips them too
        if not records:
            raise DataError(args.games, None, None, f"no finished game ({len(every)} failed)" if every else "no game")
        actions = [turn["action"] for record in records for turn in record["turns"]]
        start = time.perf_counter()
        found = signatures(game, oracle, actions)
        seconds = time.perf_counter() - start
        ids = partition(found)
        questions = [a for a in actions if game.extract_question(a) is not None]
        alike = [a for a in questions if len(set(found[a].answers)) == 1 and not found[a].wins]
        json.dump({"games": len(records), "failed_games_skipped": len(every) - len(records), "outputs": len(actions), "questions": len(questions),
                   "distinct_texts": len(set(actions)), "intentions": len(set(ids.values())),
                   "questions_answered_alike": len(alike),
                   "share_answered_alike": len(alike) / len(questions) if questions else None,
                   "answers_of_those": dict(Counter(found[a].answers[0] for a in alike).most_common()),
                   "seconds": round(seconds, 2)}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
