"""The main job's report (aria/main_report.py) from the files the steps leave behind."""
from __future__ import annotations

import json

from aria.evaluate import summarize_games, write_summary
from aria.main_report import write_report
from aria.trajectories import make_record


def test_report_lists_k_variance_training_and_success(tmp_path):
    run_dir = tmp_path / "main"
    (run_dir / "offline").mkdir(parents=True)
    (run_dir / "offline" / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "loss": 1.0 / s, "tokens_per_s": 100.0, "padded_fraction": 0.01}) + "\n" for s in (1, 2)))
    win = {"action": "Question: Is it a cat?", "question": "Is it a cat?", "observation": "Yes.", "reward": 0.0}
    dirs = []
    for name, wins in (("base", 0), ("aria", 1)):
        records = [make_record(game_id=f"g{i}", game="twenty_questions", target="Cat", turns=[win], success=i < wins)
                   for i in range(2)]
        write_summary(tmp_path / name, {"model": name, "environments": {"twenty_questions": summarize_games(records)}})
        dirs.append(tmp_path / name)
    # Both variances come from the steps kept at the chosen k (index 1), not from all steps.
    selection = {"chosen": {"k": {"questions": 3}, "criterion": "split_score"}, "ks": [2, 3, 4], "num_steps": 10,
                 "variance": {"kept_steps": {"raw": [0.05, 0.04, 0.06], "aggregated": [0.01, 0.02, 0.03]},
                              "all_steps": {"raw": 0.07, "aggregated": [0.011, 0.021, 0.031]}}}
    cfg = {"games": ["twenty_questions"], "base_model": "embedded", "run_dir": str(run_dir),
           "collect": {"num_games": 2}, "eval": {"num_games": 2}}
    report = write_report(cfg, {"twenty_questions": selection}, dirs, [("collect", 3.0), ("train", 5.0)]).read_text()
    assert "| twenty_questions | 10 | questions 3 | split_score | 0.04000 | 0.02000 | 50.0 % |" in report
    assert "| **total** | **8** |" in report
    assert "2 optimizer steps; loss first 1.0000, last 0.5000" in report and (run_dir / "report" / "training_curve.png").is_file()
    assert "| base | 0.0 (0.0-65.8), n=2 |" in report and "| aria | 50.0 (9.5-90.5), n=2 |" in report
