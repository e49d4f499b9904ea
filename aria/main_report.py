"""``report.md`` of the main job: what ran, with which config, the chosen k and the variance
reduction per game, the training curve, and success rates before and after training."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from aria.evaluate import compare_table
from aria.io import atomic_write_text
from aria.secrets import redact


def _training_curve(metrics: Path, out: Path) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    if rows:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker=".")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("REINFORCE loss")
        ax.set_title("offline ARIA training")
        fig.tight_layout()
        fig.savefig(out, dpi=90, metadata={"Software": None})
        plt.close(fig)
    return rows


def write_report(cfg: dict, selections: dict[str, dict], eval_dirs: list[Path], timings: list[tuple[str, float]]) -> Path:
    import yaml

    run_dir = Path(cfg["run_dir"])
    report_dir = run_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# ARIA main job", "",
             f"Games: {', '.join(cfg['games'])}. Base policy: {cfg['base_model']} ('embedded' = SmolLM2-135M-Instruct), "
             f"offline knowledge-base oracle. {cfg['collect']['num_games']} collected games per game; {cfg['eval']['num_games']} evaluation games "
             f"per game and model (same seeded targets), served by vLLM.", "",
             "## Steps and wall time", "", "Seconds of the run that did each step's work (a re-run skips finished steps).", "",
             "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.0f} |" for name, seconds in timings]
    lines += [f"| **total** | **{sum(s for _, s in timings):.0f}** |", "",
              "## Intention space (pipeline steps 1-4)", "",
              "Both variances are over the same steps: those kept at the chosen k.", "",
              "| game | steps | chosen k | criterion | Var(R) raw returns | Var(R~) at chosen k | reduction |",
              "|---|---|---|---|---|---|---|"]
    for game, s in selections.items():
        k = s["chosen"]["k"]
        at = s["ks"].index(next(iter(k.values())))
        var_agg = s["variance"]["kept_steps"]["aggregated"][at]
        raw = s["variance"]["kept_steps"]["raw"][at]
        reduction = f"{100 * (1 - var_agg / raw):.1f} %" if raw and var_agg is not None else "n/a (no reward variance)"
        k_text = ", ".join(f"{p} {v}" for p, v in k.items())
        lines.append(f"| {game} | {s['num_steps']} | {k_text} | {s['chosen']['criterion']} | {raw:.5f} | "
                     f"{(var_agg or 0):.5f} | {reduction} |")
    lines.append("")
    for game in selections:
        src = run_dir / "intention" / game / "selection.png"
        if src.is_file():
            shutil.copyfile(src, report_dir / f"selection_{game}.png")
            lines += [f"![k selection, {game}](selection_{game}.png)", ""]
    rows = _training_curve(run_dir / "offline" / "metrics.jsonl", report_dir / "training_curve.png")
    lines += ["", "## Offline REINFORCE", ""]
    if rows:
        lines += [f"{rows[-1]['step']} optimizer steps; loss first {rows[0]['loss']:.4f}, last {rows[-1]['loss']:.4f}; "
                  f"{sum(r['tokens_per_s'] for r in rows) / len(rows):.0f} tokens/s on average; padded fraction "
                  f"{max(r['padded_fraction'] for r in rows):.3f} at most.", "", "![training curve](training_curve.png)"]
    lines += ["", "## Success rate before and after (Wilson 95 % intervals)", "", compare_table(eval_dirs)]
    lines += ["## Configuration", "", "```yaml", yaml.safe_dump(redact(cfg), sort_keys=False).rstrip(), "```", ""]
    report = report_dir / "report.md"
    atomic_write_text(report, "\n".join(lines))
    return report
