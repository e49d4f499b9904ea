"""Playing Bargaining and Negotiation: batched matches, re-prompts, failures, resume, and tiny-model
self-play end to end into steps 1-4 of the intention-space pipeline."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aria.data import Transcript
from aria.games.common.base import load_game_config
from aria.games.two_player.glee import BargainingConfig, Match, NegotiationConfig, config_set, normalized_rewards
from aria.games.two_player.offers import ParseError, parse_reply
from aria.games.two_player.play import PolicyPlayer, ScriptedPlayer, play_two_player, read_move
from aria.intention import pipeline
from aria.llm.base import Completion
from aria.trajectories import read_trajectories

REPO = Path(__file__).resolve().parent.parent


class CannedModel:
    """A chat model that replies from a list per player key (a test policy implementing the full
    ChatModel protocol, so the match code runs unchanged; a random tiny model cannot be steered
    to write a given reply). It keeps every conversation it was sent."""

    def __init__(self, replies, name="canned"):
        self.replies = replies  # key -> list of replies, the last one repeated
        self.name = name
        self.seen: dict[str, list] = {}
        self.released: list[str] = []

    def generate(self, conversations, keys=None):
        out = []
        for conversation, key in zip(conversations, keys):
            self.seen.setdefault(key, []).append(conversation)
            script = self.replies(key) if callable(self.replies) else self.replies[key]
            n = len(self.seen[key]) - 1
            reply = script[min(n, len(script) - 1)]
            out.append(Completion(None, reply.error) if isinstance(reply, Completion) else Completion(reply))
        return out

    def release(self, key):
        self.released.append(key)


def test_scripted_matches_write_valid_records_and_resume(tmp_path):
    game_cfg = load_game_config("bargaining")
    configs = config_set(game_cfg, "eval48")[:10]
    seats = {"alice": ScriptedPlayer("bargaining", 1.0), "bob": ScriptedPlayer("bargaining", 0.5)}
    out = tmp_path / "games.jsonl"
    summary = play_two_player(game_cfg, configs, seats, out, games_per_config=2, batch_size=7, progress=False)
    assert (summary.total, summary.played, summary.failed) == (20, 20, 0)
    records = list(read_trajectories(out))
    assert len(records) == 20 and len({r["game_id"] for r in records}) == 20
    for r in records:
        assert r["players"] == ["alice", "bob"] and r["status"] == "finished"
        assert r["role_rewards"] == pytest.approx(normalized_rewards(r["meta"]["payoffs"]))
        assert r["meta"]["agents"] == {"alice": "scripted-bargainer-s1", "bob": "scripted-bargainer-s0.5"}
        assert [t["role"] for t in r["turns"]] == ["alice", "bob", "alice", "bob"][:len(r["turns"])]
        assert r["meta"]["player_1_system_prompt"].startswith("Let's play a game.")
    # Re-running plays nothing; removing a game plays exactly that one again.
    assert play_two_player(game_cfg, configs, seats, out, games_per_config=2, progress=False).played == 0
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n")
    again = play_two_player(game_cfg, configs, seats, out, games_per_config=2, progress=False)
    assert (again.already_done, again.played) == (19, 1)
    assert {r["game_id"] for r in read_trajectories(out)} == {r["game_id"] for r in records}


def test_reprompts_are_recorded_and_the_prompt_is_the_training_observation(tmp_path):
    game_cfg = load_game_config("bargaining")
    config = BargainingConfig(100, 0.9, 0.8, 4)
    model = CannedModel(lambda key: {
        "alice": ["Hello Bob! Let's talk.",                                   # no offer: re-prompted
                  '{"alice_gain": 70, "bob_gain": 40, "message": "Mine!"}',   # sum 110: re-prompted
                  'Sure. {"alice_gain": 70, "bob_gain": 30, "message": "Take it or leave it."}'],
    }[key.rsplit("/", 1)[1]])
    seats = {"alice": PolicyPlayer(model), "bob": ScriptedPlayer("bargaining", 1.0)}
    out = tmp_path / "games.jsonl"
    summary = play_two_player(game_cfg, [config], seats, out, progress=False)
    record = next(read_trajectories(out))
    # 2 re-prompts on turn 0; on the last turn (5th) the repeated proposal is refused twice more
    assert summary.extra_requests == 4 and record["num_turns"] == 5
    last = record["turns"][-1]
    assert last["forfeit"] == "reject" and all("last round" in a["error"] for a in last["attempts"])
    assert record["meta"]["outcome"] == "no_deal"
    first = record["turns"][0]
    assert [a["output"] for a in first["attempts"]] == model.replies("x/alice")[:2]
    assert "no JSON object" in first["attempts"][0]["error"]
    assert "must equal 100" in first["attempts"][1]["error"]
    assert first["action"] == model.replies("x/alice")[2] and first["offer"] == {"alice_gain": 70.0, "bob_gain": 30.0}
    assert first["shown"] == "Take it or leave it. Proposal 1 of 4: Alice gets $70, Bob gets $30."
    # The re-prompt carries the reason and the earlier reply.
    key = f"{record['game_id']}/alice"
    second_call = model.seen[key][1]
    assert second_call[1] == {"role": "assistant", "content": "Hello Bob! Let's talk."}
    assert "no JSON object" in second_call[2]["content"]
    # The first prompt is exactly the observation training will use for this turn.
    transcript = Transcript.from_config(game_cfg)
    assert model.seen[key][0][0]["content"] == transcript.render(record, 0)
    # Bob (strong, needs 0.8 * c_2) rejected 30 and countered; Alice's later turns are readable.
    assert record["turns"][1]["decision"] == "reject" and record["turns"][1]["round"] == 2
    third_prompt = model.seen[key][3][0]["content"]
    assert third_prompt == transcript.render(record, 2)
    assert third_prompt.endswith("\n\nAlice: " + first["shown"] + "\nBob: " + record["turns"][1]["shown"])
    assert model.released == [f"{record['game_id']}/alice"]  # Bob is scripted: nothing of his is cached


def test_unusable_replies_forfeit_by_the_configured_rule(tmp_path):
    game_cfg = load_game_config("negotiation")
    model = CannedModel(lambda key: ["I'm sorry, I can't help with that."])
    seats = {"alice": ScriptedPlayer("negotiation", 1.0), "bob": PolicyPlayer(model)}
    config = NegotiationConfig(100, 1.0, 1.5, 3)
    out = tmp_path / "reject.jsonl"
    play_two_player(game_cfg, [config], seats, out, progress=False)
    record = next(read_trajectories(out))
    bob = record["turns"][1]
    assert bob["forfeit"] == "reject" and len(bob["attempts"]) == game_cfg["max_reprompts"] + 1
    assert bob["shown"] == "(no valid reply)" and bob["offer"] is None
    assert record["turns"][2]["role"] == "alice" and record["turns"][2]["round"] == 3  # Alice offers again
    out = tmp_path / "no_deal.jsonl"
    play_two_player({**game_cfg, "on_invalid": "no_deal", "max_reprompts": 0}, [config], seats, out, progress=False)
    record = next(read_trajectories(out))
    assert record["num_turns"] == 2 and record["meta"]["outcome"] == "no_deal"
    assert record["role_rewards"] == {"alice": 0.5, "bob": 0.5} and len(record["turns"][1]["attempts"]) == 1


def test_a_failing_model_fails_its_game_and_the_others_finish(tmp_path):
    game_cfg = load_game_config("bargaining")
    configs = config_set(game_cfg, "eval48")[:3]
    bad = configs[1].id

    def replies(key):
        if key.startswith(bad):
            return [Completion(None, "HTTP 500 after 3 retries")]
        return ['{"alice_gain": 50, "bob_gain": 50}']

    seats = {"alice": PolicyPlayer(CannedModel(replies)), "bob": ScriptedPlayer("bargaining", 0.0)}
    out = tmp_path / "games.jsonl"
    summary = play_two_player(game_cfg, configs, seats, out, progress=False)
    assert (summary.played, summary.failed) == (3, 1)
    records = {r["game_id"]: r for r in read_trajectories(out)}
    failed = [r for r in records.values() if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["game_id"].startswith(bad) and "HTTP 500" in failed[0]["errors"][0]
    assert all(r["meta"]["outcome"] == "deal" for r in records.values() if r["status"] == "finished")
    # The failed game is played again on the next run (and fails again here).
    assert play_two_player(game_cfg, configs, seats, out, progress=False).played == 1


def test_tiny_model_self_play_into_steps_1_to_4(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    out = tmp_path / "selfplay.jsonl"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/collect_games.py"), "game=bargaining", "policy=local", f"policy.model_path={tiny_model_dir}",
         "policy.max_new_tokens=24", "config_set=smoke", "games_per_config=6", "batch_size=6", "progress=false",
         "game.max_reprompts=1", f"out={out}"],
        capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "6/6 games done" in done.stdout
    records = list(read_trajectories(out))
    assert len(records) == 6
    assert all(r["meta"]["agents"]["alice"] == r["meta"]["agents"]["bob"] for r in records)  # self-play
    # a random model writes gibberish: nearly every turn is re-prompted once, then forfeited
    turns = [t for r in records for t in r["turns"]]
    forfeited = [t for t in turns if t.get("forfeit")]
    assert len(forfeited) >= len(turns) // 2
    assert all(t["forfeit"] == "reject" and len(t["attempts"]) == 2 for t in forfeited)
    assert all(r["role_rewards"] == pytest.approx(normalized_rewards(r["meta"]["payoffs"])) for r in records)

    run_dir = tmp_path / "run"
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("intention", overrides=[
            "game=bargaining", f"input={out}", f"run_dir={run_dir}", f"embedder.model={tiny_sentence_model_dir}",
            "clustering.k_max=8"]), resolve=True)
    for step in (pipeline.step1_embed_and_cluster, pipeline.step2_select_k,
                 pipeline.step3_apply_labels, pipeline.step4_build_training_set):
        step(cfg, lambda line: None)
    train = json.loads((run_dir / "train.json").read_text())
    assert len(train) == sum(r["num_turns"] for r in records)
    assert {s["role"] for s in train} == {"alice", "bob"}
    transcript = Transcript.from_config(load_game_config("bargaining"))
    by_id = {r["game_id"]: r for r in records}
    for sample in train[:10]:
        record = by_id[sample["game_id"]]
        assert sample["observation"] == transcript.render(record, sample["turn"])
        assert sample["action"] == record["turns"][sample["turn"]]["action"]


class CannedConstrainedModel(CannedModel):
    """CannedModel that also takes the per-reply formats (and keeps them), as a constrained backend does."""

    def __init__(self, replies):
        super().__init__(replies)
        self.formats = []

    def generate(self, conversations, keys=None, formats=None):
        self.formats += list(formats)
        return super().generate(conversations, keys)


def test_a_cut_off_constrained_reply_is_sent_back_not_read_as_prose(tmp_path):
    """A constrained reply that ran out of tokens mid-message is re-prompted. Read as prose, its
    words would be taken for the opposite move: "I agree" is an acceptance."""
    cut_off = '{"decision":"reject","alice_gain":50,"bob_gain":50,"message":"I agree it is close but I want mo'
    assert parse_reply(cut_off, ("alice_gain", "bob_gain"), 100, "bob").decision == "accept"  # the hazard
    game_cfg = {**load_game_config("bargaining"), "structured_output": "json_schema"}
    model = CannedConstrainedModel(lambda key: [cut_off, '{"decision":"reject","alice_gain":40,"bob_gain":60,"message":"Less."}'])
    seats = {"alice": ScriptedPlayer("bargaining", 1.0), "bob": PolicyPlayer(model)}
    play_two_player(game_cfg, [BargainingConfig(100, 0.9, 0.8, 2)], seats, tmp_path / "g.jsonl", progress=False)
    bob = next(read_trajectories(tmp_path / "g.jsonl"))["turns"][1]
    assert [a["output"] for a in bob["attempts"]] == [cut_off]
    assert "ended before its JSON object was complete" in bob["attempts"][0]["error"]
    assert bob["decision"] == "reject" and bob["offer"] == {"alice_gain": 40.0, "bob_gain": 60.0}
    assert all(f is not None and f.kind == "json_schema" for f in model.formats)  # every reply under its turn's schema
    with pytest.raises(ParseError, match="ended before"):
        read_move(cut_off, Match(BargainingConfig(100, 0.9, 0.8, 2)), constrained=True)
