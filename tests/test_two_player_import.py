"""The original's two-player log format (``aria_two_player``) and the two-player transcript layout.

The released negotiation sample (5 games with 1536-d embeddings) is imported as it is; small
hand-made lines check the rules in the importer's module doc; the released multi-agent training
sample checks that :class:`aria.data.Transcript` lays out a transcript as the original did.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aria.data import Transcript
from aria.games.common.base import load_game_config
from aria.games.importers import import_file
from aria.io import DataError
from aria.trajectories import read_trajectories
from conftest import ORIGINAL_SAMPLES

NEGOTIATION = ORIGINAL_SAMPLES / "aria_sample_llama3-8b_negotiation_embedding_msgs.jsonl"
MULTI_SAMPLE = ORIGINAL_SAMPLES / "aria_sample_actor_reinforce_llama3-8b_multi.json"

GAME = {"player_1_name": "Alice", "player_2_name": "Bob", "player_1_system_prompt": "\nYou are Alice.\n",
        "player_2_system_prompt": "\nYou are Bob.\n", "alice_reward": 0.75, "bob_reward": 0.25,
        "alice_actions": ["I offer 60/40.", "55/45 then."], "bob_actions": ["No, 50/50."],
        "alice_ids": [0, 2], "bob_ids": [1]}


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_released_negotiation_sample(tmp_path):
    out = tmp_path / "games.jsonl"
    records = import_file(NEGOTIATION, "aria_two_player", "negotiation", out_path=out)
    assert [r["num_turns"] for r in records] == [7, 12, 13, 21, 20]
    assert list(read_trajectories(out)) == records
    first = records[0]
    assert [t["role"] for t in first["turns"]] == ["alice", "bob"] * 3 + ["alice"]
    assert first["role_rewards"] == {"alice": 0.5, "bob": 0.5}
    assert all(len(t["embedding"]) == 1536 for r in records for t in r["turns"])
    raw = json.loads(NEGOTIATION.read_text().splitlines()[0])
    assert first["turns"][2]["action"] == raw["alice_actions"][1]
    assert first["turns"][1]["embedding"] == raw["bob_actions_embeddings"][0]
    assert first["meta"]["seller_value"] == 1.0 and first["meta"]["player_1_system_prompt"] == raw["player_1_system_prompt"]


def test_json_encoded_lists_are_read(tmp_path):
    row = {**GAME, "alice_actions": json.dumps(GAME["alice_actions"]), "bob_ids": json.dumps(GAME["bob_ids"])}
    (record,) = import_file(write(tmp_path, [row]), "aria_two_player", "bargaining")
    assert [t["action"] for t in record["turns"]] == ["I offer 60/40.", "No, 50/50.", "55/45 then."]
    assert record["game"] == "bargaining" and record["role_rewards"] == {"alice": 0.75, "bob": 0.25}


@pytest.mark.parametrize("change, field", [
    ({"alice_ids": [0, 3]}, "alice_ids[1]"),              # positions not 0..n-1: the one outside
    ({"bob_ids": [10 ** 100]}, "bob_ids[0]"),             # ... in the role that gave it
    ({"seller_value": float("nan")}, "seller_value"),    # kept in meta: no other tool reads a NaN in JSON
    ({"bob_ids": [0]}, "bob_ids[0]"),                     # a position used twice
    ({"bob_ids": [1, 2]}, "bob_ids"),                     # one position per action
    ({"alice_actions": "[not json"}, "alice_actions"),
    ({"alice_reward": None}, "alice_reward"),
    ({"bob_reward": float("nan")}, "bob_reward"),
    ({"alice_action_embeddings": [[0.1], []]}, "alice_action_embeddings[1]"),
    ({"bob_actions_embeddings": [[0.1], [0.2]]}, "bob_actions_embeddings"),
    ({"alice_action_embeddings": [[0.1], [0.2, 0.3]]}, "alice_action_embeddings[1]"),  # one width
    ({"alice_actions": [], "bob_actions": [], "alice_ids": [], "bob_ids": []}, "alice_actions"),  # no turn
    ({"alice_actions": '["I offer \\ud800.", "55/45 then."]'}, "alice_actions[0]"),  # an escape inside the string
    ({"alice_actions": '[{"offer": 60, "offer": 40}]'}, "alice_actions.offer"),  # a key given twice inside the string
    ({"alice_reward": 10 ** 400}, "alice_reward"),
    ({"alice_reward": 60, "bob_reward": 40}, "alice_reward"),      # raw payoffs, not the shares
    ({"alice_reward": -0.5, "bob_reward": 1.5}, "alice_reward"),
    ({"alice_reward": 0.6, "bob_reward": 0.6}, "bob_reward"),      # shares of one game sum to 1
])
def test_bad_lines_name_file_line_and_field(tmp_path, change, field):
    path = write(tmp_path, [GAME, {**GAME, **change}])
    with pytest.raises(DataError) as err:
        import_file(path, "aria_two_player", "bargaining")
    assert str(path) in str(err.value) and "line 2" in str(err.value) and f"'{field}'" in str(err.value)


def test_missing_reward_is_an_error(tmp_path):
    row = dict(GAME)
    del row["bob_reward"]
    with pytest.raises(DataError, match="bob_reward"):
        import_file(write(tmp_path, [row]), "aria_two_player", "bargaining")


def test_transcript_layout_matches_the_released_training_sample():
    """Each released observation is a prompt then "Alice: ..\\nBob: ..\\n\\nAlice: ..": parse it into
    messages and render it back with the negotiation config's transcript settings."""
    transcript = Transcript.from_config(load_game_config("negotiation"))
    samples = json.loads(MULTI_SAMPLE.read_text())
    checked = 0
    for sample in samples:
        obs = sample["observation"]
        start = obs.find("\n\nAlice: ")
        if start < 0:
            continue
        prompt, history = obs[:start], obs[start + 2 :]
        pieces = re.split(r"\n\n?(?=(?:Alice|Bob): )", history)
        turns = [{"role": p.split(":", 1)[0].lower(), "action": p.split(": ", 1)[1]} for p in pieces]
        role = "bob" if turns[-1]["role"] == "alice" else "alice"
        record = {"game_id": "sample", "turns": [*turns, {"role": role, "action": sample["action"]}],
                  "meta": {"player_1_system_prompt": prompt, "player_2_system_prompt": prompt}}
        assert transcript.render(record, len(turns)) == obs
        checked += 1
    assert checked >= 6
