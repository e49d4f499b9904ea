"""Training sees what the policy saw: a step's prompt is the one it was played with, whole.

The release cut every training prompt on the left to 512 tokens while the policy played the whole
history, so on Guess My City about a third of the steps trained on an input without the system
prompt and the rules (``docs/method.md`` §7). Here a Guess My City game is played by a local
policy whose every prompt is recorded, turned into training samples the way pipeline step 4
renders them, and handed to the offline trainer: each sample's prompt tokens must be the played
ones, also past 512 tokens. A prompt over the cutoff is named (file, sample, length), not cut; the
release's cut stays available (``data.over_long=cut_left``); whole games in prefix trees give the
padded rows' loss and gradient.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aria.games.family import family_of
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import play_games
from aria.io import DataError
from aria.llm.local import LocalChatModel
from aria.llm.policy import Encoding, PromptTooLong, action_logprobs, collate, load_policy
from aria.packing import collate_tree, game_ordered_batches, games_floor, nominal_scale, sample_groups, tree_tokens
from aria.trainers.offline import OfflineTrainer
from aria.trajectories import read_trajectories

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def played_city_games(tmp_path_factory, tiny_model_dir, game_configs):
    """Two Guess My City games of a tiny random policy: the prompt token ids the policy generated
    from (by the prompt's text), and the training samples of every step, rendered as step 4 does."""
    game_cfg = game_configs["guess_my_city"]
    policy = LocalChatModel(str(tiny_model_dir), max_new_tokens=24, temperature=1.0, max_prompt_tokens=4096, seed=3)
    played: dict[str, list[int]] = {}
    encode = policy.encode

    def recording(conversation):
        ids = encode(conversation)
        played[conversation[-1]["content"]] = list(ids)
        return ids

    policy.encode = recording
    out = tmp_path_factory.mktemp("city") / "games.jsonl"
    play_games(build_game(game_cfg), policy, build_oracle({"name": "knowledge_base"}, game_cfg), out, num_games=2,
               seed=1, batch_size=2, progress=False)
    render = family_of(game_cfg).observation_renderer(game_cfg)
    samples = [{"observation": render(record, i), "action": turn["action"], "reward": 0.5 if i % 2 else -0.25,
                "game_id": record["game_id"]}
               for record in read_trajectories(out) for i, turn in enumerate(record["turns"])]
    return played, samples


def trainer_config(tmp_path: Path, model_dir: Path, samples: list[dict], *overrides: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "train.json").write_text(json.dumps(samples))
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = compose("reinforce_llm", overrides=[
            f"model.path={model_dir}", f"data.train_file={tmp_path / 'train.json'}", f"output_dir={tmp_path / 'out'}",
            "device=cpu", "train.mixed_precision=no", "train.threads=1", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_a_city_history_longer_than_512_tokens_trains_whole_as_it_was_played(tmp_path, tiny_model_dir, played_city_games):
    played, samples = played_city_games
    trainer = OfflineTrainer(trainer_config(tmp_path, tiny_model_dir, samples))
    assert trainer.encoding.max_prompt_tokens == 4096 and trainer.encoding.over_long == "refuse"  # the paper's cutoff
    assert len(trainer.encoded) == len(samples)
    for sample, encoded in zip(trainer.samples, trainer.encoded):
        assert encoded.input_ids[:encoded.prompt_len] == played[sample["observation"]]  # token for token
        assert not encoded.truncated
    assert max(e.prompt_len for e in trainer.encoded) > 512  # the release would have cut these
    assert sum(e.prompt_len > 512 for e in trainer.encoded) >= 4


def test_a_history_over_the_cutoff_is_named_with_file_sample_and_length(tmp_path, tiny_model_dir, played_city_games):
    _, samples = played_city_games
    tokenizer, _ = load_policy(str(tiny_model_dir))
    lengths = [Encoding(10**6).encode(tokenizer, s["observation"], s["action"]).prompt_len for s in samples]
    first = next(i for i, n in enumerate(lengths) if n > 300)
    with pytest.raises(DataError) as refused:
        OfflineTrainer(trainer_config(tmp_path, tiny_model_dir, samples, "data.max_prompt_tokens=300"))
    message = str(refused.value)
    assert str(tmp_path / "train.json") in message and f"sample {first}.observation" in message
    assert f"its prompt is {lengths[first]} tokens, over the cutoff of 300" in message
    assert "data.over_long=cut_left" in message  # the way out is named


def test_the_releases_left_cut_stays_an_option(tmp_path, tiny_model_dir, played_city_games):
    played, samples = played_city_games
    trainer = OfflineTrainer(trainer_config(tmp_path, tiny_model_dir, samples, "data.max_prompt_tokens=512",
                                            "data.over_long=cut_left"))
    cut = [(s, e) for s, e in zip(trainer.samples, trainer.encoded) if e.truncated]
    assert cut and all(e.prompt_len == 512 for _, e in cut)
    for sample, encoded in cut:  # the last 512 tokens of the played prompt: the rules are gone
        assert encoded.input_ids[:512] == played[sample["observation"]][-512:]


def test_the_cutoff_is_capped_at_the_models_context(tiny_model_dir):
    tokenizer, model = load_policy(str(tiny_model_dir))
    whole = Encoding(10**6).encode(tokenizer, "Is it a city by the sea?", "Is it Lisbon?")
    model.config.max_position_embeddings = whole.prompt_len + 2  # the prompt fits, its action does not
    encoding = Encoding(4096).for_model(model)
    assert (encoding.max_prompt_tokens, encoding.context) == (whole.prompt_len + 2,) * 2
    with pytest.raises(PromptTooLong, match=f"its prompt with its action is {len(whole.input_ids)} tokens"):
        encoding.encode(tokenizer, "Is it a city by the sea?", "Is it Lisbon?")
    assert encoding.encode(tokenizer, "Is it a city by the sea?", "").prompt_len == whole.prompt_len


def test_a_model_saved_before_over_long_was_recorded_reads_as_cut(tmp_path):
    (tmp_path / "aria_encoding.json").write_text(json.dumps({"max_prompt_tokens": 512, "append_eos": True,
                                                             "system_prompt": None}))
    assert Encoding.saved_in(tmp_path, Encoding()) == Encoding(512, True, None, "cut_left")
    (tmp_path / "aria_encoding.json").write_text(json.dumps({"max_prompt_tokens": 512, "append_eos": True,
                                                             "system_prompt": None, "over_long": "trim", "context": None}))
    with pytest.raises(DataError, match="over_long: refuse | cut_left"):
        Encoding.saved_in(tmp_path, Encoding())


def test_whole_city_games_in_trees_give_the_rows_loss_and_gradient(tiny_model_dir, played_city_games):
    """One micro-batch of two whole games, prompts past 512 tokens uncut: the tree's summed action
    log-probs and their gradient equal the padded rows' (float32, to summation order)."""
    _, samples = played_city_games
    tokenizer, model = load_policy(str(tiny_model_dir))
    encoded = [Encoding().encode(tokenizer, s["observation"], s["action"]) for s in samples]
    assert max(e.prompt_len for e in encoded) > 512
    weights = torch.tensor([s["reward"] for s in samples])
    results = []
    for batch in (collate(encoded, tokenizer.pad_token_id), collate_tree(encoded, tokenizer.pad_token_id)):
        model.zero_grad()
        loss = -(weights * action_logprobs(model, batch)).mean()
        loss.backward()
        results.append((float(loss.detach()), torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])))
    (rows_loss, rows_grad), (tree_loss, tree_grad) = results
    assert tree_loss == pytest.approx(rows_loss, rel=1e-5)
    assert float((tree_grad - rows_grad).norm() / rows_grad.norm()) < 1e-4
    # the tree computes no more than each game's own tree (the games share their opening too), a
    # fraction of the rows' tokens
    tree, floor = collate_tree(encoded, tokenizer.pad_token_id), games_floor([e.input_ids for e in encoded], sample_groups(samples))
    assert int(tree["tree_tokens"]) <= floor < sum(len(e.input_ids) for e in encoded) / 4


def test_every_game_lies_whole_in_one_micro_batch_of_about_the_nominal_size():
    groups = ["a"] * 5 + ["b"] * 3 + ["c"] * 4 + ["d"] * 9 + ["e"] * 1 + ["f"] * 2
    for epoch in range(5):
        batches = game_ordered_batches(groups, 4, seed=0, epoch=epoch)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(groups)))
        for game in set(groups):  # whole, in file order, in one micro-batch
            holding = [b for b in batches if any(groups[i] == game for i in b)]
            assert len(holding) == 1 and [i for i in holding[0] if groups[i] == game] == \
                [i for i, g in enumerate(groups) if g == game]
        assert batches == game_ordered_batches(groups, 4, seed=0, epoch=epoch)  # a resumed run sees the same
    # one sample a game: cut every 4 samples exactly, as before
    assert [len(b) for b in game_ordered_batches(list(range(10)), 4, seed=0, epoch=0)] == [4, 4, 2]
    # the cut falls at the game boundary nearest each multiple of the size: 5 | 3 4 -> [5], [3, 4] for size 4
    sizes = [len(b) for b in game_ordered_batches(["x"] * 5 + ["y"] * 3 + ["z"] * 4, 4, seed=0, epoch=0)]
    assert sum(sizes) == 12 and len(sizes) in (2, 3) and max(sizes) <= 8
    assert nominal_scale([1, 2, 3], 4) == 0.75 and nominal_scale([1, 2, 3, 4, 5, 6], 4) == 1.5


def test_the_floor_is_each_games_tree():
    a1, a2, b1 = [1, 2, 3, 9], [1, 2, 3, 4, 5, 8], [1, 2, 7]
    assert games_floor([a1, a2, b1], ["a", "a", "b"]) == tree_tokens([a1, a2]) + 3 == 7 + 3


def test_the_causal_prefix_is_the_first_trees_trunk():
    """A trunk [1, 2, 3, 4] and a branch [1, 2, 9, 8] off its second node: nodes 0-3 attend
    causally, the branch's nodes 4 and 5 do not; a second row shorter in its causal part sets it."""
    from aria.packing import causal_prefix, prefix_tree

    tree = prefix_tree([[1, 2, 3, 4], [1, 2, 9, 8]])
    mask = torch.from_numpy(tree.attends)[None, None]
    assert causal_prefix(mask) == 4
    other = torch.ones(6, 6).tril().bool()
    other[2, 0] = False  # node 2 of the second row does not see node 0
    assert causal_prefix(torch.stack([mask[0], other[None]])) == 2
    assert causal_prefix(torch.ones(1, 1, 5, 5).tril().bool()) == 5


def test_branches_are_blocks_that_see_their_part_of_the_trunk_and_themselves():
    """Samples [1, 2, 3, 4, 7, 6] (the longest: the trunk, nodes 0-5), [1, 2, 3, 4, 5] (node 6, off
    node 3) and [1, 2, 9, 8] (nodes 7-8, off node 1): node 6 sees the trunk's first 4 nodes, nodes
    7-8 its first 2 and each other; every key a node sees lies in its block's span, and a second
    tree in the row is a block that sees no trunk."""
    from aria.packing import branch_blocks, causal_prefix, prefix_tree

    tree = prefix_tree([[1, 2, 3, 4, 5], [1, 2, 9, 8], [1, 2, 3, 4, 7, 6]])
    mask = torch.from_numpy(tree.attends)[None, None]
    trunk = causal_prefix(mask)
    assert trunk == 6 and mask.shape[-1] == 9
    assert branch_blocks(mask, trunk) == [(6, 7, 4), (7, 9, 2)]
    for a, b, p in branch_blocks(mask, trunk):
        sees = mask[0, 0, a:b]
        assert not sees[:, p:a].any() and not sees[:, b:].any() and sees[:, :p].any()
    # a second tree beside the first in one row: its nodes see only each other
    other = prefix_tree([[5, 6, 7]])
    row = torch.zeros(1, 1, 12, 12, dtype=torch.bool)
    row[0, 0, :9, :9], row[0, 0, 9:, 9:] = mask[0, 0], torch.from_numpy(other.attends)
    assert branch_blocks(row, causal_prefix(row)) == [(6, 7, 4), (7, 9, 2), (9, 12, 0)]
    # no saving where the rest is one block that sees the whole trunk
    assert branch_blocks(torch.ones(1, 1, 4, 4).tril().bool(), 2) is None


def test_trunk_attention_gives_dense_attentions_log_probs_and_gradient(tiny_model_dir, played_city_games, monkeypatch):
    """Two whole Guess My City games in one micro-batch: with the trunk on the causal kernel (the
    default) or every node against every node, the same action log-probs and gradient."""
    from aria.packing import causal_prefix

    _, samples = played_city_games
    tokenizer, model = load_policy(str(tiny_model_dir))
    encoded = [Encoding().encode(tokenizer, s["observation"], s["action"]) for s in samples]
    batch = collate_tree(encoded, tokenizer.pad_token_id)
    n = batch["input_ids"].shape[1]
    assert 512 < causal_prefix(batch["attention_mask"]) < n  # a long trunk, and branches after it
    weights = torch.tensor([s["reward"] for s in samples])
    found = {}
    for way in ("dense", "trunk", "blocks"):
        monkeypatch.setenv("ARIA_TREE_ATTENTION", way)
        model.zero_grad()
        logp = action_logprobs(model, batch)
        (-(weights * logp).mean()).backward()
        found[way] = (logp.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
    assert model.config._attn_implementation == "sdpa"  # put back after the forward
    for way in ("trunk", "blocks"):
        torch.testing.assert_close(found[way][0], found["dense"][0], rtol=1e-5, atol=1e-4)
        assert float((found[way][1] - found["dense"][1]).norm() / found["dense"][1].norm()) < 1e-4
    monkeypatch.setenv("ARIA_TREE_ATTENTION", "sparse")
    with pytest.raises(ValueError, match="ARIA_TREE_ATTENTION: unknown 'sparse'"):
        action_logprobs(model, batch)


def test_a_node_that_sees_a_later_node_gets_no_blocks():
    """Blocks assume parents come first; a layout where a branch node sees a node after it (not one
    :func:`collate_tree` makes, but a mask from elsewhere) falls back to one masked call."""
    from aria.packing import branch_blocks

    mask = torch.ones(1, 1, 8, 8).tril().bool()
    mask[0, 0, 4:, 2:4] = False  # nodes 4-7: a branch off node 1 ...
    assert branch_blocks(mask, 4) is not None
    mask[0, 0, 5, 6] = True  # ... whose node 5 sees node 6
    assert branch_blocks(mask, 4) is None


def test_blocks_are_found_once_a_forward_and_only_for_float32_attention(tiny_model_dir, played_city_games, monkeypatch):
    """In float32 the blocks are found once a forward (not once a layer); under bfloat16 autocast
    (as accelerate's mixed precision runs the forward) they are not found at all, the branches take
    one masked call, and the log-probs are dense attention's within bfloat16's rounding."""
    import aria.packing

    _, samples = played_city_games
    tokenizer, model = load_policy(str(tiny_model_dir))
    assert model.config.num_hidden_layers > 1
    encoded = [Encoding().encode(tokenizer, s["observation"], s["action"]) for s in samples]
    batch = collate_tree(encoded, tokenizer.pad_token_id)
    calls = []
    find = aria.packing.branch_blocks
    monkeypatch.setattr(aria.packing, "branch_blocks", lambda *a: calls.append(1) or find(*a))
    found = {}
    for way, dtype in [("dense", torch.float32), ("blocks", torch.float32), ("dense", torch.bfloat16),
                       ("blocks", torch.bfloat16)]:
        monkeypatch.setenv("ARIA_TREE_ATTENTION", way)
        calls.clear()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            found[way, dtype] = action_logprobs(model, batch).float()
        assert len(calls) == (1 if (way, dtype) == ("blocks", torch.float32) else 0), (way, dtype)
    torch.testing.assert_close(found["blocks", torch.float32], found["dense", torch.float32], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(found["blocks", torch.bfloat16], found["dense", torch.bfloat16], rtol=0.02, atol=0.05)
    assert not torch.equal(found["blocks", torch.bfloat16], found["blocks", torch.float32])  # autocast did apply


def test_a_tree_without_branches_trains_under_bfloat16_autocast(tiny_model_dir):
    """One sample alone in a micro-batch (a one-step training set, a one-turn game): the whole tree
    is its causal trunk. Under bf16 autocast (the default mixed precision on AVX512-BF16 and AMX
    CPUs) that crashed with an empty query ("cannot reshape tensor of 0 elements"), found by an
    adversarial pass training on [{"observation": "o", "action": "a", "reward": 1.0}]."""
    tokenizer, model = load_policy(str(tiny_model_dir))
    batch = collate_tree([Encoding().encode(tokenizer, "o", "a")], tokenizer.pad_token_id)
    found = {}
    for way in ("blocks", "dense"):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARIA_TREE_ATTENTION", way)
            found[way] = action_logprobs(model, batch).float()
    torch.testing.assert_close(found["blocks"], found["dense"], rtol=0.02, atol=0.05)
