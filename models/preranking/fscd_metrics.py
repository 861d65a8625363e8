"""The FSCD cascade's evaluation: AUC, GAUC, recall@k against the teacher and feature cost of
every model on a split, the choice of λ on validation, the headline figures and the trade-off
plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from models.preranking.config_registry import CascadeTrainConfig
from models.preranking.fscd_data import EvalSplit
from models.preranking.fscd_phases import model_cost, used_fields


@torch.no_grad()
def predict(model: nn.Module, codes: torch.Tensor, batch: int = 65_536) -> np.ndarray:
    model.eval()
    return torch.cat(
        [torch.sigmoid(model(codes[s : s + batch]).float()) for s in range(0, len(codes), batch)]
    ).numpy()


def gauc(labels: np.ndarray, scores: np.ndarray, users: np.ndarray) -> float:
    """Impression-weighted mean of per-user AUC over users with both classes.

    Vectorized with the rank-sum form of AUC (ties get average ranks, as in roc_auc_score):
    a per-user loop over sklearn took minutes for 5,000 users x 8 models.
    """
    frame = pd.DataFrame({"y": labels.astype(np.int64), "s": scores, "u": users})
    frame["r"] = frame.groupby("u")["s"].rank(method="average")
    frame["pos_rank"] = frame["r"] * frame["y"]
    per_user = frame.groupby("u").agg(
        n=("y", "size"), pos=("y", "sum"), rank_sum=("pos_rank", "sum")
    )
    per_user = per_user[(per_user["pos"] > 0) & (per_user["pos"] < per_user["n"])]
    if per_user.empty:
        return float("nan")
    neg = per_user["n"] - per_user["pos"]
    auc = (per_user["rank_sum"] - per_user["pos"] * (per_user["pos"] + 1) / 2) / (
        per_user["pos"] * neg
    )
    return float((auc * per_user["n"]).sum() / per_user["n"].sum())


def recall_at_k(scores: np.ndarray, teacher: np.ndarray, users: np.ndarray, k: int) -> float:
    """Mean over users with more than k candidates of |top-k(model) ∩ top-k(teacher)| / k.

    Ties are broken by row order, the same for both rankings.
    """
    frame = pd.DataFrame({"s": scores, "t": teacher, "u": users})
    by_user = frame.groupby("u")
    frame["n"] = by_user["s"].transform("size")
    frame["both"] = (by_user["s"].rank(method="first", ascending=False) <= k) & (
        by_user["t"].rank(method="first", ascending=False) <= k
    )
    eligible = frame[frame["n"] > k]
    if eligible.empty:
        return float("nan")
    return float((eligible.groupby("u")["both"].sum() / k).mean())


def evaluate_models(
    models: dict[str, nn.Module],
    split: EvalSplit,
    costs: dict[str, float],
    config: CascadeTrainConfig,
) -> list[dict[str, Any]]:
    """One row per model on one split: AUC, GAUC, recall@k vs the teacher, cost, cost ratio."""
    scores = {name: predict(m, split.codes) for name, m in models.items()}
    teacher_cost = model_cost(used_fields(models["teacher"]), costs)
    teacher_auc = float(roc_auc_score(split.labels, scores["teacher"]))
    rows = []
    for name, model in models.items():
        fields = used_fields(model)
        auc = float(roc_auc_score(split.labels, scores[name]))
        cost = model_cost(fields, costs)
        rows.append(
            {
                "model": name,
                "auc": auc,
                "gauc": gauc(split.labels, scores[name], split.users),
                f"recall_at_{config.recall_k}": recall_at_k(
                    scores[name], scores["teacher"], split.users, config.recall_k
                ),
                "auc_ratio": auc / teacher_auc,
                "cost": cost,
                "cost_ratio": cost / teacher_cost,
                "fields": list(fields),
                "score_spread": float(np.std(scores[name])),
                # ~0 when the model scores every row about the same (it ranks nothing),
                # whatever the click rate those scores sit at.
                "relative_spread": relative_spread(scores[name]),
            }
        )
    return rows


CONSTANT_SCORES = 1e-2
"""A model whose scores' standard deviation on a split is below this share of their mean
ranks nothing. Relative, because a click model's scores sit near the click rate: at a 0.5%
rate a spread of 1e-5 (which an absolute threshold of 1e-6 passes) is a constant."""
SPREAD_EPS = 1e-12


def relative_spread(scores: np.ndarray) -> float:
    """``std / (|mean| + eps)`` of a model's scores on a split: 0 for a constant model."""
    if len(scores) == 0:
        return 0.0
    return float(np.std(scores) / (abs(float(np.mean(scores))) + SPREAD_EPS))


class DegenerateModel(RuntimeError):
    """Every candidate FSCD model scores the validation rows the same: nothing to deploy."""


class OverBudget(DegenerateModel):
    """No FSCD model ranks within the cost budget: deploying one over it breaks the budget."""


class BelowBaseline(DegenerateModel):
    """No FSCD model within the budget beats item popularity on the validation rows."""


def choose_fscd(
    validation_rows: list[dict[str, Any]], budget: float, baseline_auc: float | None = None
) -> dict[str, Any]:
    """The FSCD row with the best validation AUC within the cost budget.

    Raises :class:`DegenerateModel` when every FSCD model's scores are constant (relative to
    their scale), :class:`OverBudget` when none that ranks is within ``budget``, and
    :class:`BelowBaseline` when the best within it does not beat ``baseline_auc`` (item
    popularity's AUC on the same validation rows). Pass validation rows only: choosing on the
    test rows would report the best of several test draws, an optimistic figure the deployed
    model would not reproduce.
    """
    fscd = [r for r in validation_rows if r["model"].startswith("fscd_")]
    if not fscd:
        raise ValueError("no fscd_<λ> rows to choose from; fscd_strengths must not be empty")
    ranking = [r for r in fscd if r.get("relative_spread", 1.0) >= CONSTANT_SCORES]
    if not ranking:
        raise DegenerateModel(
            f"every FSCD model ({', '.join(r['model'] for r in fscd)}) scores all validation "
            f"rows the same (spread under {CONSTANT_SCORES:g} of the mean score; kept fields "
            f"{[r.get('fields') for r in fscd]}): its AUC is no result. Check the training set for "
            "empty or constant fields"
        )
    within = [r for r in ranking if r["cost_ratio"] <= budget + 1e-9]
    if not within:
        cheapest = min(ranking, key=lambda r: (r["cost_ratio"], -r["auc"]))
        raise OverBudget(
            f"no FSCD model that ranks is within the cost budget {budget:g}: the cheapest, "
            f"{cheapest['model']}, costs {cheapest['cost_ratio']:.3g} of the teacher; add "
            "stronger fscd_strengths or raise cost_budget"
        )
    best = max(within, key=lambda r: r["auc"])
    if baseline_auc is None:
        return best
    # Popularity itself can rank below chance on a few clicks: chance is the floor then.
    floor, against = (
        (baseline_auc, f"item popularity's {baseline_auc:.4f}")
        if baseline_auc >= 0.5
        else (0.5, f"chance (0.5; item popularity's is {baseline_auc:.4f})")
    )
    if not best["auc"] > floor:
        raise BelowBaseline(
            f"the best FSCD model within the cost budget, {best['model']}, has validation AUC "
            f"{best['auc']:.4f}, not above {against} on the same rows: nothing worth "
            "registering. Train on more impressions or clicks"
        )
    return best


def headline_metrics(
    validation_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
    config: CascadeTrainConfig,
    baseline: dict[str, float] | None = None,
) -> dict[str, float]:
    """The run's figures: λ chosen on the validation rows, every reported figure from the test
    rows of that same λ (and of the teacher and the two-tower baseline). ``baseline``: item
    popularity's ``validation_auc`` and ``test_auc`` (:func:`popularity_auc`), which the chosen
    model must beat on validation; reported as ``popularity_validation_auc`` and
    ``popularity_auc``."""
    by_name = {r["model"]: r for r in test_rows}
    floor = None if baseline is None or not config.beat_baseline else baseline["validation_auc"]
    on_validation = choose_fscd(validation_rows, config.cost_budget, floor)
    chosen = by_name[on_validation["model"]]
    teacher, two_tower = by_name["teacher"], by_name["two_tower"]
    validation_teacher = next(r for r in validation_rows if r["model"] == "teacher")
    recall_key = f"recall_at_{config.recall_k}"
    return {
        "teacher_auc": teacher["auc"],
        "teacher_gauc": teacher["gauc"],
        "fscd_auc": chosen["auc"],
        "fscd_gauc": chosen["gauc"],
        "two_tower_auc": two_tower["auc"],
        "two_tower_gauc": two_tower["gauc"],
        "auc_ratio": chosen["auc"] / teacher["auc"],
        "cost_ratio": chosen["cost_ratio"],
        "recall_at_k": chosen[recall_key],
        "two_tower_recall_at_k": two_tower[recall_key],
        "two_tower_cost_ratio": two_tower["cost_ratio"],
        "fscd_strength": float(chosen["model"].removeprefix("fscd_")),
        "fscd_validation_auc": on_validation["auc"],
        "teacher_validation_auc": validation_teacher["auc"],
        "validation_auc_ratio": on_validation["auc"] / validation_teacher["auc"],
        **(
            {}
            if baseline is None
            else {
                "popularity_validation_auc": baseline["validation_auc"],
                "popularity_auc": baseline["test_auc"],
            }
        ),
    }


def popularity_auc(split: EvalSplit) -> float:
    """AUC of item popularity (each item's clicks in the training rows) on ``split``: the
    baseline a learned pre-ranker must beat. 0.5 when the split has one class only."""
    if len(np.unique(split.labels)) < 2:
        return 0.5
    return float(roc_auc_score(split.labels, split.popularity))


def plot_tradeoff(
    validation_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
    chosen: str,
    path: Path,
    budget: float | None = None,
) -> None:
    """AUC vs feature cost ratio across λ, on validation (where λ is chosen) and on test (what
    is reported); the teacher and the two-tower baseline as single test points; ``budget``
    (the cost ratio the chosen model must stay within) as a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted((r for r in rows if r["model"].startswith("fscd_")), key=_sweep_order)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for rows, style, label in (
        (validation_rows, "o--", "FSCD λ sweep, validation"),
        (test_rows, "o-", "FSCD λ sweep, test"),
    ):
        points = sweep(rows)
        ax.plot([r["cost_ratio"] for r in points], [r["auc"] for r in points], style, label=label)
    # λs that kept the same fields land on one point: one label naming them all.
    labels: dict[tuple[float, float], list[str]] = {}
    for r in sweep(test_rows):
        point = (round(float(r["cost_ratio"]), 6), round(float(r["auc"]), 6))
        labels.setdefault(point, []).append(r["model"].removeprefix("fscd_"))
    for (cost, auc), strengths in labels.items():
        ax.annotate(f"λ={', '.join(strengths)}", (cost, auc), fontsize=7)
    if budget is not None:
        ax.axvline(budget, color="grey", linestyle=":", label=f"cost budget ({budget:g})")
    pick = next(r for r in test_rows if r["model"] == chosen)
    ax.plot([pick["cost_ratio"]], [pick["auc"]], "*", markersize=14, label=f"chosen ({chosen})")
    for name, marker in (("teacher", "s"), ("two_tower", "^")):
        r = next(r for r in test_rows if r["model"] == name)
        ax.plot([r["cost_ratio"]], [r["auc"]], marker, label=f"{name}, test")
    ax.set_xlabel("feature cost / teacher's")
    ax.set_ylabel("AUC")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sweep_order(row: dict[str, Any]) -> tuple[float, float]:
    return (row["cost_ratio"], float(row["model"].removeprefix("fscd_")))
