"""The k-selection plot: every criterion and the reward variances against k, chosen k marked."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from aria.io import atomic_save_figure
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): matplotlib


def _series(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _plot_agreement(ax, ks: np.ndarray, against: dict, title: str, legend: str) -> None:
    """The labels against a known partition of the steps, per k (1 = the same partition)."""
    ax.plot(ks, _series(against["ari"]), marker=".", lw=1, label="adjusted Rand index")
    ax.plot(ks, _series(against["nmi"]), marker=".", lw=1, label="normalised mutual information")
    ax.set_title(title, fontsize=9)
    ax.legend(loc=legend, fontsize=8)


def _plot_recovery(ax, ks: np.ndarray, recovery: dict) -> None:
    """The known intentions against the labels, where the player recorded them."""
    _plot_agreement(ax, ks, recovery, f"labels against the {recovery['intentions']} recorded intentions of "
                    f"{recovery['steps']} steps (1 = the same partition)", "lower right")


def _plot_behaviour(ax, ks: np.ndarray, behaviour: dict) -> None:
    """The exact partition of the game's offline oracle against the labels, and R~ against its R~."""
    _plot_agreement(ax, ks, behaviour, f"labels against the {behaviour['step_intentions']} behavioural intentions "
                    "of the steps (1 = the same partition); R~ against theirs: bias^2 + variance within", "upper left")
    error = ax.twinx()
    error.plot(ks, _series(behaviour["bias_squared"]), color="tab:red", ls="--", lw=1, label="bias^2 (merged intentions)")
    error.plot(ks, _series(behaviour["variance_within"]), color="tab:purple", ls="--", lw=1,
               label="variance within (split intentions)")
    error.legend(loc="upper right", fontsize=8)


def _plot_variance(ax, ks: np.ndarray, variance: dict) -> None:
    """Var(R~) against Var(R), on the kept steps and on all of them (the claim checked per k)."""
    ax.plot(ks, _series(variance["kept_steps"]["raw"]), color="tab:red", lw=1.2, label="Var(R), kept steps")
    ax.plot(ks, _series(variance["kept_steps"]["aggregated"]), color="tab:blue", marker=".", lw=1.2, label="Var(R~), kept steps")
    ax.axhline(variance["all_steps"]["raw"], color="tab:red", ls=":", lw=1, label="Var(R), all steps")
    ax.plot(ks, _series(variance["all_steps"]["aggregated"]), color="tab:blue", ls=":", lw=1, label="Var(R~), all steps")
    holds = "holds" if variance["claim"]["holds"] else f"fails at k = {variance['claim']['violations']}"
    ax.set_title(f"reward variance (Var(R~) <= Var(R) on the same kept steps: {holds})", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("k (number of intention clusters)")


def plot_selection(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.array(report["ks"])
    curves = report["curves"]
    chosen = report["chosen"]
    k_marks = sorted(set(chosen["k"].values()))
    eps = report["settings"]["selection"]["epsilon"]
    panels = [
        ("split_score", "SplitScore  (mean |R~(k+1) - R~(k)|)", eps),
        ("silhouette", "silhouette (higher = better)", None),
        ("calinski_harabasz", "Calinski-Harabasz (higher = better)", None),
        ("davies_bouldin", "Davies-Bouldin (lower = better)", None),
    ]
    recovery = report.get("intention_recovery")
    behaviour = report.get("behaviour")
    extra = bool(recovery) + bool(behaviour)
    fig, axes = plt.subplots(5 + extra, 1, figsize=(8, 13 + 2.6 * extra), sharex=True)
    if recovery:
        _plot_recovery(axes[4], ks, recovery)
    if behaviour:
        _plot_behaviour(axes[4 + bool(recovery)], ks, behaviour)
    for ax, (name, title, line) in zip(axes, panels):
        ax.plot(ks, _series(curves[name]), marker=".", lw=1)
        if line is not None:
            ax.axhline(line, color="grey", ls=":", label=f"epsilon = {line}")
            ax.legend(loc="upper right", fontsize=8)
        best = report["choices_by_criterion"][name]["k"]
        ax.axvline(best, color="tab:orange", ls="--", lw=1)
        ax.set_title(f"{title}; by itself picks k = {best}", fontsize=9)
    _plot_variance(axes[-1], ks, report["variance"])
    for ax in axes:
        for k in k_marks:
            ax.axvline(k, color="tab:green", lw=1.5)
    fig.suptitle(f"{report['game']}: chosen k = {', '.join(map(str, k_marks))} ({chosen['criterion']}), "
                 f"{report['num_steps']} steps", fontsize=11)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=90, metadata={"Software": None})
