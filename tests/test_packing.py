"""Prefix-tree packing (aria/packing.py): a micro-batch's samples merged along their shared
prefixes give the same log-probs, scores, losses and gradients as one padded row per sample.

The samples are real: games the tiny model plays against the knowledge-base oracle through the
collection code (rendered to training samples as pipeline step 4 renders them), the original
release's single-agent and two-player training samples, prompts cut on the left, and all of these
mixed in one micro-batch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aria.packing import (collate_tree, game_ordered_batches, packing_stats, prefix_tree, sample_groups,
                          score_position, tree_tokens)
from aria.llm.policy import Encoding, action_logprobs, collate, load_policy
from conftest import ORIGINAL_SAMPLES

REPO = Path(__file__).resolve().parents[1]


# ---- the tree by hand -------------------------------------------------------------------------------
def test_prefix_tree_by_hand():
    tree = prefix_tree([[1, 2, 3, 4], [1, 2, 5], [1, 6]])
    # trunk = the longest sequence; then 5 branches off node 1 (token 2), 6 off node 0 (token 1)
    assert tree.input_ids.tolist() == [1, 2, 3, 4, 5, 6] and tree.trunk == 4
    assert tree.positions.tolist() == [0, 1, 2, 3, 2, 1]
    assert tree.samples.tolist() == [0, 1, 2]  # lexicographic order
    assert [p.tolist() for p in tree.paths] == [[0, 1, 2, 3], [0, 1, 4], [0, 5]]
    assert tree.leaves.tolist() == [3, 4, 5]
    expected = np.zeros((6, 6), dtype=bool)
    for node, ancestors in {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 4], 5: [0, 5]}.items():
        expected[node, ancestors] = True
    assert (tree.attends == expected).all()
    assert tree_tokens([[1, 2, 3, 4], [1, 2, 5], [1, 6]]) == 6
    # identical sequences share every node; a sequence that is a prefix of another adds nothing
    same = prefix_tree([[7, 8], [7, 8], [7]])
    assert same.input_ids.tolist() == [7, 8] and [p.tolist() for p in same.paths] == [[0], [0, 1], [0, 1]]
    with pytest.raises(ValueError):
        prefix_tree([[1], []])


def test_samples_that_share_little_get_trees_of_their_own():
    """A sample joins the tree before it when it shares at least half its tokens with its
    predecessor (in token order); the micro-batch is then one padded batch of trees."""
    from aria.packing import micro_batch_tokens, tree_groups

    sequences = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [9, 8, 7], [1, 2, 8, 8, 8, 8, 8, 8]]
    assert tree_groups(sequences) == [[0, 1], [3], [2]]  # [1,2,...8] shares 2 of 8 tokens: a tree of its own
    assert micro_batch_tokens(sequences) == (7 + 8 + 3, 3 * 8)


def test_small_trees_share_a_row_first_fit_in_decreasing_size():
    from aria.packing import tree_rows

    # rows as long as the largest tree (5): 5 alone; 3 + 2; then 2 + 1 (no room left beside 3 + 2)
    assert tree_rows([2, 5, 3, 1, 2]) == [[1], [2, 0], [4, 3]]
    assert tree_rows([4]) == [[0]] and tree_rows([1, 3, 1, 1]) == [[1], [0, 2, 3]]


def test_the_cheaper_layout_by_hand():
    """Tree layout against padded rows, each cell costing 1 + its row's length / break_even."""
    from aria.packing import cheaper_layout, layout_cost

    a, b = list(range(10)), list(range(5)) + list(range(20, 25))  # b shares half of a: one tree of 15 nodes
    assert layout_cost(1, 15, 10.0) == 15 * 2.5 and layout_cost(2, 10, 10.0) == 2 * 10 * 2.0
    assert cheaper_layout([a, b], 10.0) == "prefix_tree"  # 37.5 against 40
    assert cheaper_layout([a, b], 2.0) == "padded"  # 15 * 8.5 = 127.5 against 2 * 10 * 6 = 120
    assert cheaper_layout([a, b], None) == "prefix_tree"  # no model figure: always trees
    # five steps of one game: a tree of 14 nodes against 5 rows of up to 14
    game = [list(range(10 + k)) for k in range(5)]
    assert cheaper_layout(game, 2.0) == "prefix_tree"


def test_attention_break_even_counts_the_body_weights(tiny_model_dir):
    """body weights / (2 · hidden · layers), the body counted by hand from the tiny Llama's shapes."""
    from aria.packing import attention_break_even

    _, model = load_policy(str(tiny_model_dir))
    c = model.config
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size \
        + 2 * c.hidden_size  # q, o; k, v; gate, up, down; two norms
    body = c.num_hidden_layers * layer + c.hidden_size  # the final norm
    assert attention_break_even(model) == pytest.approx(body / (2 * c.hidden_size * c.num_hidden_layers))


def test_a_micro_batch_that_is_cheaper_in_rows_is_laid_out_in_rows(tiny_model_dir, played_samples):
    """The steps of played games stay in trees even when attention dominates (one tree is far
    shorter than their rows together); two samples that share only half their tokens go to rows
    once attention costs more than the weights (:func:`test_the_cheaper_layout_by_hand`)."""
    from aria.llm.policy import EncodedSample, collate_as

    tokenizer, _ = load_policy(str(tiny_model_dir))
    encoded = encode_all(tokenizer, played_samples)
    pad = tokenizer.pad_token_id
    for break_even in (None, 3000.0, 1e-3):
        assert "logit_nodes" in collate_as(encoded, pad, "prefix_tree", break_even=break_even)
    assert "logit_nodes" not in collate_as(encoded, pad, "padded", break_even=None)
    half = [EncodedSample(list(range(3, 13)), 8), EncodedSample(list(range(3, 8)) + list(range(20, 25)), 8)]
    assert "logit_nodes" in collate_as(half, pad, "prefix_tree", break_even=10.0)
    rows = collate_as(half, pad, "prefix_tree", break_even=2.0)
    assert all(torch.equal(rows[k], v) for k, v in collate(half, pad).items())

    stats = packing_stats(half + encoded, [[0, 1], list(range(2, 2 + len(encoded)))], break_even=2.0)
    assert stats["micro_batches_in_rows"] == 1
    assert stats["computed_tokens"] == 20 + stats["tree_tokens"] - 15  # the half-sharing pair: 20 row tokens, not 15 nodes
    assert packing_stats(half, [[0, 1]], break_even=10.0)["computed_tokens"] == 15


def test_score_position_reads_what_a_padded_row_reads():
    assert score_position([5, 6, 2], pad_id=0) == 2
    assert score_position([5, 6, 2, 2], pad_id=2) == 1  # pad == end of turn: the action's last token
    assert score_position([2, 2], pad_id=2) == 0
    assert score_position([5, 6, 2], pad_id=None) == 2


def test_sample_groups_are_games_and_roles():
    """(Micro-batches of whole games: tests/test_whole_histories.py.)"""
    assert sample_groups([{"game_id": "g", "role": "alice"}, {"game_id": "g", "role": "bob"}, {}]) == \
        [("g", "alice"), ("g", "bob"), ("#", 2)]


# ---- real samples ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def played_samples(tmp_path_factory, tiny_model_dir) -> list[dict]:
    """Training samples of four games the tiny model played (the collection code, the knowledge
    base oracle), rendered as pipeline step 4 renders them, with their game ids and turns."""
    from aria.games.common.base import load_game_config
    from aria.games.family import family_of
    from aria.games.question.game import build_game
    from aria.games.question.oracle import build_oracle
    from aria.games.question.play import play_games
    from aria.llm.local import LocalChatModel
    from aria.trajectories import read_trajectories

    game_cfg = {**load_game_config("twenty_questions_subset"), "max_turns": 6}
    out = tmp_path_factory.mktemp("games") / "games.jsonl"
    policy = LocalChatModel(str(tiny_model_dir), max_new_tokens=12, seed=0, dtype="float32")
    play_games(build_game(game_cfg), policy, build_oracle({"name": "knowledge_base"}, game_cfg), out, num_games=4,
               seed=0, batch_size=4, progress=False)
    render = family_of(game_cfg).observation_renderer(game_cfg)
    samples = [{"observation": render(r, i), "action": t["action"], "reward": -1.0 + 0.25 * i,
                "step_return": -float(len(r["turns"]) - i), "game_id": r["game_id"], "turn": i}
               for r in read_trajectories(out) for i, t in enumerate(r["turns"])]
    assert len({s["game_id"] for s in samples}) == 4 and len(samples) >= 8
    return samples


def original_samples(kind: str) -> list[dict]:
    return json.loads((ORIGINAL_SAMPLES / f"aria_sample_actor_reinforce_llama3-8b_{kind}.json").read_text())


def original_two_player_game() -> list[dict]:
    """Alice's steps of one game of the original release's two-player set: each observation is
    the game's transcript up to one of her turns (what she saw then), the action her message."""
    sample = original_samples("multi")[0]
    text = sample["observation"]
    steps, at = [], text.find("\n\nAlice: ")
    while at != -1:
        end = text.find("\n", at + 2)
        steps.append({"observation": text[:at], "action": text[at + 9 : end if end != -1 else len(text)]})
        at = text.find("\n\nAlice: ", at + 2)
    steps.append({"observation": text, "action": sample["action"]})
    assert len(steps) >= 3
    return steps


def encode_all(tokenizer, samples, max_prompt_tokens=2048, append_eos=True):
    # cut_left: the layouts of prompts cut on the left (data.over_long=cut_left) are tested too
    return [Encoding(max_prompt_tokens, append_eos, over_long="cut_left").encode(tokenizer, s["observation"], s["action"])
            for s in samples]


def cases(tokenizer, played):
    """name -> encoded micro-batch."""
    single, multi = original_samples("single"), original_samples("multi")
    truncated = encode_all(tokenizer, played[:6], max_prompt_tokens=40)
    assert all(e.truncated for e in truncated)
    return {
        "one_game": encode_all(tokenizer, [s for s in played if s["game_id"] == played[0]["game_id"]]),
        "question_games": encode_all(tokenizer, played),
        "truncated": truncated,
        "two_player": encode_all(tokenizer, original_two_player_game()),
        # the release's samples cut to 1,024 prompt tokens (four of the nine are longer, up to 2,129):
        # the eager attention of padded rows is quadratic in the longest row (90 s uncut on 2 cores)
        "mixed": encode_all(tokenizer, played[:5]) + truncated[:2]
        + encode_all(tokenizer, single[:4] + multi[:3] + original_two_player_game()[:2], max_prompt_tokens=1024)
        + encode_all(tokenizer, played[:1]),  # a duplicate sample too
    }


def gradients(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("case", ["one_game", "question_games", "truncated", "two_player", "mixed"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_logprobs_loss_and_gradient_equal_padded_rows(case, attention, tiny_model_dir, played_samples):
    from peft import LoraConfig, get_peft_model

    from aria.trainers.losses import reinforce_loss

    tokenizer, model = load_policy(str(tiny_model_dir))
    model.config._attn_implementation = attention
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    encoded = cases(tokenizer, played_samples)[case]
    reward = torch.linspace(-1.0, 1.0, len(encoded))
    tree, rows = collate_tree(encoded, tokenizer.pad_token_id), collate(encoded, tokenizer.pad_token_id)

    results = []
    for batch in (rows, tree):
        model.zero_grad()
        logp = action_logprobs(model, batch)
        loss = reinforce_loss(logp, reward)
        loss.backward()
        results.append((logp.detach(), float(loss), gradients(model)))
    (logp_rows, loss_rows, grad_rows), (logp_tree, loss_tree, grad_tree) = results
    assert torch.allclose(logp_tree, logp_rows, rtol=1e-5, atol=1e-4), (logp_tree - logp_rows).abs().max()
    assert loss_tree == pytest.approx(loss_rows, rel=1e-5, abs=1e-5)
    assert (grad_tree - grad_rows).norm() <= 1e-4 * grad_rows.norm()
    if case in ("one_game", "question_games", "two_player"):  # steps of the same games share their history
        assert tree["input_ids"].numel() < 0.7 * sum(len(e.input_ids) for e in encoded)
    if case == "mixed":  # small trees (cut prompts, other games) sit side by side in a row
        from aria.packing import tree_groups

        assert tree["input_ids"].shape[0] < len(tree_groups([e.input_ids for e in encoded]))

    # The comparison can fail: the same tokens without the tree's mask (one causal sequence) differ.
    n = tree["input_ids"].shape[1]
    wrong = dict(tree, attention_mask=torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n))
    with torch.no_grad():
        assert (action_logprobs(model, wrong) - logp_rows).abs().max() > 1e-3


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_tree_scores_and_their_gradient_equal_padded_rows(pad_is_eos, tiny_model_dir, played_samples):
    """The score head read through peft at each sample's node, as a padded row reads it (with the
    pad token equal to the end-of-turn token, the action's last token before it)."""
    from peft import LoraConfig, get_peft_model

    from aria.trainers.losses import weighted_mse_loss
    from aria.trainers.reward_model import load_reward_model, reward_scores

    tokenizer, model = load_reward_model(str(tiny_model_dir))
    pad = tokenizer.eos_token_id if pad_is_eos else tokenizer.pad_token_id
    model.config.pad_token_id = pad
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS",
                                             init_lora_weights=False))
    encoded = cases(tokenizer, played_samples)["mixed"]
    target = torch.linspace(0.0, 1.0, len(encoded))
    results = []
    for batch in (collate(encoded, pad), collate_tree(encoded, pad)):
        model.zero_grad()
        score = reward_scores(model, batch)
        weighted_mse_loss(score, target).backward()
        results.append((score.detach(), gradients(model)))
    (rows, grad_rows), (tree, grad_tree) = results
    assert torch.allclose(tree, rows, rtol=1e-5, atol=1e-5), (tree - rows).abs().max()
    assert (grad_tree - grad_rows).norm() <= 1e-4 * grad_rows.norm()


def test_packing_stats_count_shared_tokens_and_truncated_prompts(tiny_model_dir, played_samples):
    tokenizer, _ = load_policy(str(tiny_model_dir))
    encoded = encode_all(tokenizer, played_samples) + encode_all(tokenizer, played_samples[:3], max_prompt_tokens=40)
    batches = [list(range(len(played_samples))), list(range(len(played_samples), len(encoded)))]
    stats = packing_stats(encoded, batches)
    assert stats["row_tokens"] == sum(len(e.input_ids) for e in encoded)
    from aria.packing import micro_batch_tokens

    assert stats["tree_tokens"] == sum(micro_batch_tokens([encoded[i].input_ids for i in b])[0] for b in batches)
    assert stats["truncated_prompts"] == 3 and stats["saving"] > 1.5


# ---- the trainers -----------------------------------------------------------------------------------
def trainer_config(tmp_path: Path, model_dir: Path, data: list[dict], name: str = "reinforce_llm", *overrides: str) -> dict:
    from aria.resources import compose_config

    tmp_path.mkdir(parents=True, exist_ok=True)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(data))
    return compose_config(name, [f"model.path={model_dir}", f"data.train_file={train_file}", f"output_dir={tmp_path / 'out'}",
                                 "device=cpu", "train.mixed_precision=no", "train.warmup_ratio=0",
                                 "train.lr_scheduler=constant", *overrides])


def step_loss_and_gradient(trainer, indices: list[int], packing: str) -> tuple[float, torch.Tensor]:
    trainer.packing = packing
    trainer.model.zero_grad()
    loss = trainer.micro_loss(trainer.make_batch(indices), indices)
    loss.backward()
    return float(loss), gradients(trainer.model)


@pytest.mark.parametrize("trainer_name", ["reinforce", "reward_model", "traj_dpo"])
def test_every_trainer_computes_the_same_step_packed_and_padded(trainer_name, tmp_path, tiny_model_dir, played_samples):
    """One micro-batch of the packed order through each trainer's own loss, in both layouts."""
    from aria.trainers.dpo import TrajectoryDPOTrainer
    from aria.trainers.offline import OfflineTrainer
    from aria.trainers.reward_model import RewardModelTrainer

    games = sorted({s["game_id"] for s in played_samples})
    data = [dict(s, reward=0.1 * (s["turn"] % 7), target="Dog", success=games.index(s["game_id"]) % 2 == 0)
            for s in played_samples]  # two won and two lost games of one target: two DPO pairs
    cls, cfg_name, extra = {"reinforce": (OfflineTrainer, "reinforce_llm", ["method=no_aggregation"]),
                            "reward_model": (RewardModelTrainer, "reward_model", ["data.eval_fraction=0", "model.lora.enabled=true"]),
                            "traj_dpo": (TrajectoryDPOTrainer, "reinforce_llm", ["method=traj_dpo"])}[trainer_name]
    cfg = trainer_config(tmp_path, tiny_model_dir, data, cfg_name, "train.micro_batch_size=8",
                         "train.gradient_accumulation_steps=1", "train.packing=prefix_tree", *extra)
    trainer = cls(cfg)
    indices = trainer._epoch_batches(0)[0]
    packed = step_loss_and_gradient(trainer, indices, "prefix_tree")
    padded = step_loss_and_gradient(trainer, indices, "padded")
    assert packed[0] == pytest.approx(padded[0], rel=1e-5, abs=1e-5)
    assert (packed[1] - padded[1]).norm() <= 1e-4 * padded[1].norm() and padded[1].norm() > 0


def stopped_at_step_2(cfg) -> None:
    """An offline training interrupted (as by Ctrl-C) after its second optimizer step."""
    from aria.trainers.offline import OfflineTrainer

    def crash(step):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        OfflineTrainer(cfg, on_step=crash).train()


def test_packed_training_resumes_bit_identically(tmp_path, tiny_model_dir, played_samples):
    from safetensors.torch import load_file

    from aria.trainers.offline import OfflineTrainer

    common = ["train.epochs=2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.save_freq=1",
              "train.lr=0.005", "model.lora.dropout=0.2", "train.keep_checkpoints=null", "train.packing=prefix_tree",
              "method=no_aggregation", "train.threads=1"]  # one thread whatever the load: the same sums in the same order
    full = OfflineTrainer(trainer_config(tmp_path / "full", tiny_model_dir, played_samples, "reinforce_llm", *common)).train()
    last = f"step-{full['steps']}"
    expected = load_file(str(tmp_path / "full" / "out" / "checkpoints" / last / "trainable.safetensors"))

    cut = trainer_config(tmp_path / "cut", tiny_model_dir, played_samples, "reinforce_llm", *common)
    stopped_at_step_2(cut)
    resumed = OfflineTrainer(cut).train()
    assert resumed["resumed_from"].endswith("step-2") and resumed["steps"] == full["steps"] >= 3
    got = load_file(str(tmp_path / "cut" / "out" / "checkpoints" / last / "trainable.safetensors"))
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    metrics = [json.loads(line) for line in (tmp_path / "full" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["sharing"] > 1.0 and 0 <= m["padded_fraction"] < 1 for m in metrics)
    # the same data in the padded layout is another run: its checkpoints are not resumed (said
    # before the model loads, by the setting; the data digest would say it after)
    other = trainer_config(tmp_path / "cut", tiny_model_dir, played_samples, "reinforce_llm",
                           *[c for c in common if not c.startswith("train.packing=")], "train.packing=padded")
    with pytest.raises(ValueError, match="train.packing was 'prefix_tree', now 'padded'"):
        OfflineTrainer(other)


@pytest.mark.parametrize("damage", ["tensor file cut short", "torn trainer state"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(damage, tmp_path, tiny_model_dir, played_samples, capsys):
    """Before: a traceback while loading the newest checkpoint, and no resume at all."""
    from aria.trainers.offline import OfflineTrainer

    common = ["train.epochs=1", "train.micro_batch_size=4", "train.gradient_accumulation_steps=1", "train.save_freq=1",
              "train.keep_checkpoints=null", "method=no_aggregation"]

    cfg = trainer_config(tmp_path / "run", tiny_model_dir, played_samples, "reinforce_llm", *common)
    stopped_at_step_2(cfg)
    newest = tmp_path / "run" / "out" / "checkpoints" / "step-2"
    if damage == "tensor file cut short":
        weights = newest / "trainable.safetensors"
        weights.write_bytes(weights.read_bytes()[:-64])
    else:
        (newest / "trainer_state.json").write_text('{"step": 2, "epo')
    capsys.readouterr()
    resumed = OfflineTrainer(cfg).train()
    assert resumed["resumed_from"].endswith("step-1") and resumed["steps"] >= 3
    assert f"[checkpoint] {newest} is damaged (" in capsys.readouterr().err


@pytest.mark.subprocess
def test_two_processes_train_packed_games(tmp_path, tiny_model_dir, played_samples):
    """``accelerate launch`` with two CPU processes (torchrun, gloo): the packed micro-batches are
    split between the processes, each holds consecutive steps of games, and every step trains."""
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(played_samples))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "config/accelerate/cpu_2proc.yaml"),
         str(REPO / "scripts/run_offline.py"), f"model.path={tiny_model_dir}", f"data.train_file={train_file}",
         f"output_dir={out}", "device=cpu", "train.mixed_precision=no", "train.epochs=1", "train.micro_batch_size=3",
         "train.gradient_accumulation_steps=1", "train.save_freq=1", "train.packing=prefix_tree", "method=no_aggregation",
         "logging.write_data_order=true"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "prefix-tree packing" in done.stdout
    orders = [json.loads((out / f"data_order_epoch0_rank{r}.json").read_text()) for r in (0, 1)]
    seen = [{i for b in order for i in b} for order in orders]
    assert seen[0] and seen[1] and not seen[0] & seen[1] and len(orders[0]) == len(orders[1])
    for order in orders:
        for batch in order:
            games = [played_samples[i]["game_id"] for i in batch]
            assert sum(a != b for a, b in zip(games, games[1:])) <= 1  # consecutive steps of at most two games
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == len(orders[0]) and all(s["sharing"] > 1.0 for s in steps)
    assert (out / "final" / "adapter_model.safetensors").is_file()
