"""The deliberate bugs of issue 17, one at a time, each against the test written to catch it.

A reviewer planted small bugs in the code that connects the method's pieces (which reward goes
with which sample, the two-player rewards, the online update's sign, the choice of k, ...) and
found the suite passing. For each bug this script edits a scratch copy of the repository, runs
the named test there and records whether it fails ("caught"), so the claim "this test catches
that bug" is re-checked by a command, not remembered. The working tree is never touched.

    python benchmarks/deliberate_bugs.py     # -> benchmarks/results/deliberate_bugs.json (about 3 minutes)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation import REPO, copy_repository  # noqa: E402

# (bug, file, original text, buggy text, the test that must fail)
BUGS = [
    ("offline rewards shifted against their batch", "aria/trainers/offline.py",
     "self.rewards[indices].to(logp.device), **self.loss_options)",
     "self.rewards[:len(indices)].to(logp.device), **self.loss_options)", "tests/test_offline_trainer.py::test_each_sample_is_weighted_by_its_own_reward"),
    ("a two-player step gets the other role's reward", "aria/intention/corpus.py",
     'value = record.get("role_rewards", {}).get(role)',
     'value = record.get("role_rewards", {}).get({"alice": "bob", "bob": "alice"}.get(role, role))',
     "tests/test_release_conventions.py::test_two_player_returns_by_hand_unequal_payoffs_and_turns"),
    ("T counted over both roles' turns", "aria/intention/corpus.py",
     "counts = {role: sum(1 for c, *_ in utterances if c == role)",
     "counts = {role: sum(1 for c, *_ in utterances if c in spec.trained)",
     "tests/test_release_conventions.py::test_two_player_returns_by_hand_unequal_payoffs_and_turns"),
    ("online advantages negated", "aria/trainers/online.py", "adv[indices].to(logp.device)",
     "-adv[indices].to(logp.device)", "tests/test_online.py::test_an_online_step_raises_the_favoured_action"),
    ("SplitScore window of tau values instead of tau+1", "aria/intention/select.py", "below[i : i + tau + 1]",
     "below[i : i + tau]", "tests/test_aggregation.py::test_split_score_window_is_tau_plus_one_values_strictly_below_epsilon"),
    ("SplitScore <= epsilon instead of <", "aria/intention/select.py", "< epsilon  # NaN", "<= epsilon  # NaN",
     "tests/test_aggregation.py::test_split_score_window_is_tau_plus_one_values_strictly_below_epsilon"),
    ("silhouette treated as smaller-is-better", "aria/intention/select.py", '_best(curves["silhouette"], ks, True',
     '_best(curves["silhouette"], ks, False', "tests/test_select.py::test_each_index_picks_the_planted_k"),
    ("Davies-Bouldin treated as larger-is-better", "aria/intention/select.py", '_best(curves["davies_bouldin"], ks, False',
     '_best(curves["davies_bouldin"], ks, True', "tests/test_select.py::test_each_index_picks_the_planted_k"),
    ("silhouette always 0", "aria/intention/select.py", 'return {"silhouette": self.silhouette(labels),',
     'return {"silhouette": 0.0,', "tests/test_select.py::test_indices_equal_scikit_learn"),
    ("first-action rule off by one", "aria/intention/aggregate.py", "[table.step_utterance] > 0",
     "[table.step_utterance] > 1", "tests/test_release_conventions.py::test_first_action_rule_drops_only_the_opening_message"),
    ("loss.backward() without accelerate's accumulation scaling", "aria/trainers/engine.py", "acc.backward(loss)",
     "loss.backward()", "tests/test_offline_trainer.py::test_gradient_accumulation_averages_like_one_large_batch"),
    ("action log-probs at the wrong temperature (the gradient-variance test's own reference)", "aria/llm/policy.py",
     "picked = torch.log_softmax(rows, dim=-1)", "picked = torch.log_softmax(rows * 2, dim=-1)",
     "tests/test_offline_trainer.py::test_gradient_variance_tool_by_hand"),
    ("k-means ignores the seed (a constant stub passes determinism)", "aria/intention/cluster.py",
     "random_state=seed + k)", "random_state=k)", "tests/test_cluster.py::test_kmeans_is_deterministic_and_resumable"),
    ("Wilson interval with a wrong half-width", "aria/statistics.py", "half = z * math.sqrt", "half = 0.5 * z * math.sqrt",
     "tests/test_evaluation.py::test_interrupted_evaluation_resumes_without_duplicates"),
    ("summary counts a failed game as finished", "aria/statistics.py",
     'finished = [r for r in records if r["status"] == "finished"]', "finished = list(records)",
     "tests/test_evaluation.py::test_summary_counts_by_hand"),
    ("DPO's reference is the policy being trained (adapter left on)", "aria/trainers/dpo.py",
     'model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()', "nullcontext()",
     "tests/test_methods.py::test_two_steps_of_trajectory_dpo_on_a_tiny_model"),
    ("DPO's chosen and rejected games swapped", "aria/trainers/losses.py",
     "delta = (chosen - ref_chosen) - (rejected - ref_rejected)", "delta = (rejected - ref_rejected) - (chosen - ref_chosen)",
     "tests/test_losses.py::test_dpo_loss_by_hand"),
    ("DPO pairs games of different targets", "aria/trainers/methods.py",
     'groups.setdefault((first["target"], role), ([], []))', 'groups.setdefault(role, ([], []))',
     "tests/test_methods.py::test_traj_dpo_pairs"),
    ("GiGPO's step groups ignore the target", "aria/trainers/methods.py",
     'episode_group, _group_ids([(int(g), s["observation"])', 'episode_group, _group_ids([(0, s["observation"])',
     "tests/test_methods.py::test_gigpo_step_groups_stay_within_a_target"),
    ("games go on starting after the policy's server is lost (each game on its own)", "aria/scheduler.py",
     "following = next(queue, None) if not summary.stopped else None", "following = next(queue, None)",
     "tests/test_scheduler.py::test_no_game_starts_once_the_server_is_lost_and_a_re_run_plays_the_rest"),
    ("games go on starting after the policy's server is lost (in step)", "aria/scheduler.py",
     "while todo and len(live) < batch_size and not summary.stopped:", "while todo and len(live) < batch_size:",
     "tests/test_scheduler.py::test_no_game_starts_once_the_server_is_lost_and_a_re_run_plays_the_rest"),
    ("a behavioural signature ignores the wins (a guess is a question)", "aria/intention/behaviour.py",
     "wins = tuple(t for t in targets if game.is_win(question, t))", "wins = ()",
     "tests/test_behaviour.py::test_signatures_and_the_partition_by_hand"),
    ("a windowed key starts one turn late", "aria/intention/aggregate.py",
     "start = before[-window] if window", "start = before[-window + 1] if window",
     "tests/test_aggregation.py::test_windowed_key_by_hand"),
    ("R~'s error against the behavioural R~ with bias and variance swapped", "aria/intention/aggregate.py",
     "bias_squared, variance_within = float(np.mean((m - reference) ** 2)), float(np.mean((q - m) ** 2))",
     "variance_within, bias_squared = float(np.mean((m - reference) ** 2)), float(np.mean((q - m) ** 2))",
     "tests/test_aggregation.py::test_error_against_the_reference_partition_by_hand"),
    ("labels: behavioural silently labels with the clusters", "aria/intention/pipeline.py",
     'if cfg.labels == "behavioural":  # the exact partition', 'if False:  # the exact partition',
     "tests/test_intention_pipeline.py::test_behavioural_intentions_in_steps_2_and_3_by_hand"),
    ("GiGPO's similarity compares the shared prompt too", "aria/trainers/methods.py",
     "cut = len(commonprefix(list(texts))) if len(texts) > 1 else 0", "cut = 0",
     "tests/test_methods.py::test_gigpo_similarity_groups_by_hand"),
    ("clipped loss takes the larger surrogate (no bound for negative weights)", "aria/trainers/losses.py",
     "surrogate = torch.minimum(", "surrogate = torch.maximum(", "tests/test_losses.py::test_clipped_loss_by_hand"),
    ("KL penalty rewards moving away from the collecting policy", "aria/trainers/losses.py",
     "surrogate = surrogate - kl_coef", "surrogate = surrogate + kl_coef", "tests/test_losses.py::test_clipped_loss_by_hand"),
    ("prefix-tree tokens left in tree order, not sample order", "aria/llm/policy.py",
     "return picked[order], sample[order]", "return picked, sample",
     "tests/test_offline_trainer.py::test_the_clipped_loss_starts_with_reinforces_gradient_on_any_batch"),
    ("reference tokens of the batch taken in file order", "aria/trainers/offline.py",
     "torch.cat([self.reference[i] for i in indices])", "torch.cat([self.reference[i] for i in sorted(indices)])",
     "tests/test_offline_trainer.py::test_the_clipped_loss_starts_with_reinforces_gradient_on_any_batch"),
    ("a resumed clipped run recomputes its reference from the resumed model", "aria/trainers/offline.py",
     "if stored[\"data_digest\"] == self.data_digest:", "if False:",
     "tests/test_offline_trainer.py::test_the_clipped_loss_keeps_negative_weights_bounded_and_resumes"),
    ("a frozen critic encoder keeps texts as encoded in their first batch", "aria/trainers/critic.py",
     "cache.update((text, self._encode([text])[0].float()) for text in missing)",
     "cache.update(zip(missing, self._encode(missing).float()))",
     "tests/test_critic.py::test_a_kept_encoding_does_not_depend_on_the_texts_beside_it"),
    ("a finished critic trains again when the runner resumes", "aria/experiment/runner.py",
     'if done.is_file() and (out_dir / "train.json").is_file():', "if False:",
     "tests/test_experiment.py::test_archer_trains_its_critic_each_iteration_and_its_actor_after_the_warm_up"),
]


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of the report."""
    caught = sum(b["caught"] and b["passes_without_the_bug"] for b in report["bugs"])
    return [{"compares": "each planted bug's test with the bug against without it (it must fail, then pass)",
             "result": f"{caught} of {len(report['bugs'])} bugs caught"}]


def main() -> None:
    results = []
    with tempfile.TemporaryDirectory(prefix="aria-bugs-") as tmp:
        work = Path(tmp)
        copy_repository(work, None)
        env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1"}  # the copy's package, not the installed one
        for bug, path, original, buggy, test in BUGS:
            source = (work / path).read_text()
            if source.count(original) != 1:
                sys.exit(f"{path}: expected one occurrence of {original!r}; update this bug's text")
            clean = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=work, env=env,
                                   capture_output=True, text=True)
            (work / path).write_text(source.replace(original, buggy))
            start = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test], cwd=work,
                                      env=env, capture_output=True, text=True)
            finally:
                (work / path).write_text(source)
            row = {"bug": bug, "file": path, "test": test, "passes_without_the_bug": clean.returncode == 0,
                   "caught": done.returncode != 0, "seconds": round(time.perf_counter() - start, 1)}
            results.append(row)
            print(f"{'caught' if row['caught'] and row['passes_without_the_bug'] else 'NOT CAUGHT'}: {bug} <- {test}", flush=True)
    ok = all(r["caught"] and r["passes_without_the_bug"] for r in results)
    out = REPO / "benchmarks" / "results" / "deliberate_bugs.json"
    out.write_text(json.dumps({"all_caught": ok, "bugs": results}, indent=1) + "\n", encoding="utf-8")
    print(f"{sum(r['caught'] and r['passes_without_the_bug'] for r in results)}/{len(results)} caught -> {out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
