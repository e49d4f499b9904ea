"""Did training move the policy (aria/experiment/movement.py)? The weight-change share by hand at float32 and
bfloat16, and the token KL and log-prob change against a brute force on tiny models."""
from __future__ import annotations

import math

import pytest
import torch

from aria.experiment.movement import compare_policies, movement, weight_change_share, whole_games
from aria.llm.policy import encode_sample, load_policy
from conftest import build_tiny_chat_model, naive_action_logprob

STEPS = [("Let's play a game of Twenty Questions. Guess the object.", "Question: Is it an animal?", True),
         ("Here is the game history: Question: Is it a fruit? Answer: Yes.", "Question: Is it red?", False),
         ("Guess the object. Is your city in Asia?", "Question: Is it a fruit?", True),
         ("Now, please proceed by asking your next question.", "Is it an animal? Answer: No.", False),
         ("Question: Is it an animal?", "Yes.", False)]


def test_weight_change_share_by_hand(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    weight = model.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        weight[0, 0] = weight[0, 1] = 1.0
    model.save_pretrained(tmp_path / "parent")
    with torch.no_grad():
        weight[0, 0] = 1.0 + 2.0 ** -12  # below bfloat16's step at 1.0 (2^-7): rounds back to 1.0
        weight[0, 1] = 1.5  # exact in bfloat16
    model.save_pretrained(tmp_path / "child")
    elements = sum(p.numel() for p in model.state_dict().values()) - (
        model.lm_head.weight.numel() if model.config.tie_word_embeddings else 0)
    f32 = weight_change_share(tmp_path / "parent", tmp_path / "child", "float32")
    bf16 = weight_change_share(tmp_path / "parent", tmp_path / "child", "bfloat16")
    assert (f32["elements"], f32["changed"], bf16["changed"], bf16["changed_float32"]) == (elements, 2, 1, 2)
    assert bf16["share"] == pytest.approx(1 / elements) and bf16["share_float32"] == pytest.approx(2 / elements)
    assert bf16["kept_share"] == 0.5 and f32["kept_share"] == 1.0  # half the update survives bfloat16
    assert weight_change_share(tmp_path / "parent", tmp_path / "parent", "bfloat16")["changed"] == 0
    with pytest.raises(ValueError, match="dtype: unknown 'int8'"):
        weight_change_share(tmp_path / "parent", tmp_path / "child", "int8")
    # another model's weights are refused, not compared
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other"
    other.mkdir()
    tensors = load_file(str(tmp_path / "child" / "model.safetensors"))
    save_file({**tensors, "extra.weight": torch.zeros(2)}, str(other / "model.safetensors"))
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=r"hold different tensors: only in the child \['extra.weight'\]"):
        weight_change_share(tmp_path / "parent", other)  # the command's arguments: one line (aria.cli.command)


def brute_force(parent, child, encoded) -> tuple[float, list[float]]:
    """Mean token KL(child || parent) and each step's log-prob change, one unpadded step at a time
    and one action position at a time, in float64."""
    kl, tokens, changes = 0.0, 0, []
    for e in encoded:
        ids = torch.tensor([e.input_ids])
        ours, theirs = child(input_ids=ids).logits[0].double(), parent(input_ids=ids).logits[0].double()
        for position in range(e.prompt_len, len(e.input_ids)):
            p, q = torch.softmax(ours[position - 1], -1), torch.softmax(theirs[position - 1], -1)
            kl += float(sum(p[v] * (math.log(p[v]) - math.log(q[v])) for v in range(len(p))))
            tokens += 1
        changes.append(float(naive_action_logprob(child, e) - naive_action_logprob(parent, e)))
    return kl / tokens, changes


@torch.no_grad()
def test_token_kl_and_logprob_change_equal_a_brute_force(tmp_path, tiny_model_dir):
    tokenizer, parent = load_policy(str(tiny_model_dir))
    _, child = load_policy(str(build_tiny_chat_model(tmp_path / "other", seed=1)))
    encoded = [encode_sample(tokenizer, obs, act, 512) for obs, act, _ in STEPS]
    won = [w for _, _, w in STEPS]
    found = compare_policies(parent, child, encoded, won, tokenizer.pad_token_id, batch_size=2)
    kl, changes = brute_force(parent, child, encoded)
    assert found["token_kl"] > 0.01 and found["token_kl"] == pytest.approx(kl, rel=1e-5)
    assert found["tokens"] == sum(e.action_len for e in encoded) and found["steps"] == 5 and found["steps_won"] == 2
    assert found["logprob_change"] == pytest.approx(sum(changes) / 5, abs=1e-4)
    assert found["logprob_change_won"] == pytest.approx((changes[0] + changes[2]) / 2, abs=1e-4)
    assert found["logprob_change_lost"] == pytest.approx((changes[1] + changes[3] + changes[4]) / 3, abs=1e-4)
    same = compare_policies(parent, parent, encoded, won, tokenizer.pad_token_id, batch_size=3)
    assert same["token_kl"] == 0.0 and same["logprob_change"] == 0.0  # a model does not move from itself
    only_lost = compare_policies(parent, child, encoded[1:2], [False], tokenizer.pad_token_id)
    assert only_lost["logprob_change_won"] is None


GAME = ["Let's play a game of Twenty Questions. History: none. Ask your next question.",
        "Let's play a game of Twenty Questions. History: Is it alive? No. Ask your next question.",
        "Let's play a game of Twenty Questions. History: Is it alive? No. Is it metal? Yes. Ask your next question."]


def test_the_kl_interval_takes_games_as_the_sample_by_hand():
    """Three games: KL sums 1, 2, 6 over 10, 10, 20 tokens; KL = 9/40 = 0.225; residuals
    K_g - 0.225 T_g = -1.25, -0.25, 1.5; SE = sqrt(3/2 * (1.5625 + 0.0625 + 2.25)) / 40."""
    from aria.experiment.movement import ratio_interval

    sums, counts = torch.tensor([0.5, 0.5, 2.0, 6.0]), torch.tensor([4.0, 6.0, 10.0, 20.0])
    se = (1.5 * 3.875) ** 0.5 / 40
    low, high = ratio_interval(sums, counts, ["a", "a", "b", "c"])
    assert (low, high) == pytest.approx([0.225 - 1.959964 * se, 0.225 + 1.959964 * se])
    assert ratio_interval(sums, counts, ["a"] * 4) == [0.225, 0.225]  # one game: no spread to estimate
    assert ratio_interval(torch.tensor([0.0, 0.0, 3.0]), torch.ones(3), None)[0] == 0.0  # clipped, as a KL


@torch.no_grad()
def test_whole_games_in_prefix_trees_equal_the_brute_force(tmp_path, tiny_model_dir):
    """Two games of three steps sharing their history, each computed as one prefix tree: the same
    KL and log-prob changes as one unpadded step at a time."""
    tokenizer, parent = load_policy(str(tiny_model_dir))
    _, child = load_policy(str(build_tiny_chat_model(tmp_path / "other", seed=1)))
    steps = [(obs, act) for obs, act in zip(GAME, ["Is it alive?", "Is it metal?", "Is it a key?"])]
    steps += [(obs.replace("Twenty", "20"), act) for obs, act in steps]
    encoded = [encode_sample(tokenizer, obs, act, 512) for obs, act in steps]
    won, games = [True] * 3 + [False] * 3, ["a"] * 3 + ["b"] * 3
    found = compare_policies(parent, child, encoded, won, tokenizer.pad_token_id, games=games)
    kl, changes = brute_force(parent, child, encoded)
    assert found["token_kl"] > 0.01 and found["token_kl"] == pytest.approx(kl, rel=1e-5)
    low, high = found["token_kl_ci95"]
    assert low < found["token_kl"] < high  # two games: an interval around the mean
    assert found["logprob_change_won"] == pytest.approx(sum(changes[:3]) / 3, abs=1e-4)
    assert found["logprob_change_lost"] == pytest.approx(sum(changes[3:]) / 3, abs=1e-4)
    with pytest.raises(ValueError, match="6 steps but 6 outcomes and 5 games"):
        compare_policies(parent, child, encoded, won, tokenizer.pad_token_id, games=games[:5])


def test_whole_games_are_drawn_won_and_lost_in_turn():
    # games by step: a a b c c c d e (won: a, d; lost: b, c, e)
    games, won = list("aabcccde"), [True, True, False, False, False, False, True, False]
    chosen = whole_games(games, won, at_least=4, seed=0)
    picked = {games[i] for i in chosen}
    assert chosen == sorted(chosen) and all(games.count(g) == sum(games[i] == g for i in chosen) for g in picked)
    assert len(chosen) >= 4 and {won[i] for i in chosen} == {True, False}  # one won game and one lost at least
    assert whole_games(games, won, at_least=100) == list(range(8))  # fewer steps than asked: every game
    assert whole_games(games, won, at_least=1, seed=3) in ([0, 1], [6])  # the first draw is a won game
    assert whole_games(games, won, at_least=4, seed=0) == chosen  # seeded


def test_movement_of_model_folders(tmp_path, tiny_model_dir):
    other = build_tiny_chat_model(tmp_path / "other", seed=1)
    samples = [{"observation": o, "action": a, "success": w, "reward": 1.0} for o, a, w in STEPS]
    found = movement(tiny_model_dir, other, samples, "bfloat16", max_steps=3)
    assert found["steps"] == 3 and found["token_kl"] > 0
    assert found["weights"]["dtype"] == "bfloat16" and found["weights"]["share"] > 0.9  # two random models
    games = [{**s, "game_id": f"g{i // 3}", "role": None} for i, s in enumerate(samples)]  # g0: 3 steps, g1: 2
    whole = movement(tiny_model_dir, other, games, "float32", max_steps=2)
    assert whole["games"] == 1 and whole["steps"] in (2, 3) and whole["token_kl"] > 0
    with pytest.raises(ValueError, match=r"steps.json, field 'sample 1.success': expected a bool"):
        movement(tiny_model_dir, other, [samples[0], {"observation": "x", "action": "y"}], source="steps.json")


def test_the_script_writes_its_result_and_names_a_bad_sample(tmp_path, tiny_model_dir):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "movement.py"
    steps = tmp_path / "train.json"
    steps.write_text(json.dumps([{"observation": o, "action": a, "success": w} for o, a, w in STEPS]))
    out = tmp_path / "movement.json"
    done = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(tiny_model_dir), str(steps),
                           "--served-dtype", "bfloat16", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["token_kl"] == 0.0 and result["weights"]["changed"] == 0 and result["steps"] == 5
    steps.write_text(json.dumps([{"observation": "x", "action": "y", "success": "yes"}]))
    from in_process import run_script  # the bad sample in this process: the script ran as a process above

    done = run_script(script, str(tiny_model_dir), str(tiny_model_dir), str(steps))
    assert done.returncode == 2 and done.stderr.strip() == f"error: {steps}, field 'sample 0.success': expected a bool " \
        "(a pipeline step-4 sample)"
    steps.write_text("[]")  # before: a traceback (the script's own catch was replaced by aria.cli.command)
    done = run_script(script, str(tiny_model_dir), str(tiny_model_dir), str(steps))
    assert done.returncode == 2 and done.stderr.strip() == f"error: {steps}: no steps to compare the models on (an empty list)"


def test_a_diverged_another_or_no_model_is_named_not_measured(tmp_path, tiny_model_dir):
    from aria.io import ConfigError

    samples = [{"observation": o, "action": a, "success": w} for o, a, w in STEPS]
    tokenizer, model = load_policy(str(tiny_model_dir))
    with torch.no_grad():  # a training that diverged: NaN weights (before: token KL 0.0, "did not move")
        next(p for n, p in model.named_parameters() if "mlp" in n).fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    tokenizer.save_pretrained(tmp_path / "nan")
    with pytest.raises(ConfigError, match=r"the trained model .*nan: its log-probabilities are NaN on step \d"):
        movement(tiny_model_dir, tmp_path / "nan", samples)
    # Another vocabulary: one line naming the tensor, before the models load (before: a shape RuntimeError)
    _, model = load_policy(str(tiny_model_dir))
    model.resize_token_embeddings(model.config.vocab_size + 8)
    model.save_pretrained(tmp_path / "vocab")
    tokenizer.save_pretrained(tmp_path / "vocab")
    with pytest.raises(ConfigError, match=r"vocab: tensor (lm_head|model\.embed_tokens)\.weight has shape"):
        movement(tiny_model_dir, tmp_path / "vocab", samples)
    # A folder that holds weights but no model's config (before: transformers' tokenizer ValueError)
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "model.safetensors").write_bytes((tmp_path / "nan" / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"the trained model: .*loose.* holds no config.json"):
        movement(tiny_model_dir, tmp_path / "loose", samples)
