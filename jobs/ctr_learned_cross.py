"""Learned cross features: node embeddings whose small pairwise function predicts a pair's CTR.

The idea of PCF-GNN (arXiv 2105.07752), reduced to its core and without message passing:
instead of storing one explicit row per (a, b) pair, store one embedding per node and predict
the pair's smoothed CTR as ``sigmoid(bias + w_a + w_b + <e_a, e_b>)``. Pairs that are rare or
never seen then still get an estimate, and storage grows with nodes, not pairs. Fitted on the
explicit statistic of :mod:`jobs.ctr_cross_stats` (weighted by impressions) for a random 80% of
the pairs, scored on the other 20%::

    .venv/bin/python -m jobs.ctr_learned_cross \\
        --features .cascade/lake/features/ctr_cross/generated/user_cat/dt=2026-11-22 \\
        --pair user_cat --keys user_id item_category --window 30

Reports Spearman and RMSE of the held-out prediction against the explicit smoothed CTR, the
same for the additive baseline (no interaction term), and the storage of both forms.

What the learned features are for is the rare pair: :func:`rare_pair_scores` fits both models
on every pair of one partition (window ``fit_window``), takes the pairs seen at most
``rare_max`` times in it, and ranks them against their *later* explicit value, the smoothed
CTR of the same pair in the following, disjoint window (a partition ``later_window`` or more
days on, pairs with an impression there). Give ``--later`` to run it::

    .venv/bin/python -m jobs.ctr_learned_cross \\
        --features .cascade/lake/features/ctr_cross/generated/user_cat/dt=2026-11-15 \\
        --later .cascade/lake/features/ctr_cross/generated/user_cat/dt=2026-11-22 \\
        --pair user_cat --keys user_id item_category --window 30 --later-window 7
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch


@dataclass(kw_only=True)
class LearnedCrossConfig:
    """Size and fit of the learned cross model."""

    dim: int = 8
    """Embedding size per node."""
    steps: int = 300
    """Full-batch Adam steps."""
    learning_rate: float = 0.05
    """Adam learning rate."""
    prior_impressions: float = 1.0
    """Gaussian prior on every node's terms, in impressions: the fit minimizes
    ``sum(imp * log-loss) + prior_impressions * sum(param ** 2)``, so a node seen a few times
    stays near zero while one seen thousands of times is free to move (shrinkage that scales
    with the data, unlike a fixed weight decay on a mean loss, which flattens all but the
    heaviest nodes of a Zipf-shaped log)."""
    init_scale: float = 0.1
    """Standard deviation of the initial embeddings (too small and <e_a, e_b> barely moves)."""
    holdout_fraction: float = 0.2
    """Share of pairs held out for scoring."""
    seed: int = 0
    """Seed of the split and the initialisation."""

    def __post_init__(self) -> None:
        if self.dim < 1 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError("dim and steps must be >= 1 and learning_rate > 0")
        if self.prior_impressions < 0 or self.init_scale <= 0:
            raise ValueError("prior_impressions must be >= 0 and init_scale > 0")
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")


def _fit(
    a: torch.Tensor,
    b: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor,
    sizes: tuple[int, int],
    config: LearnedCrossConfig,
    interaction: bool,
) -> Any:
    generator = torch.Generator().manual_seed(config.seed)
    scale = config.init_scale
    emb_a = (torch.randn(sizes[0], config.dim, generator=generator) * scale).requires_grad_()
    emb_b = (torch.randn(sizes[1], config.dim, generator=generator) * scale).requires_grad_()
    w_a = torch.zeros(sizes[0], requires_grad=True)
    w_b = torch.zeros(sizes[1], requires_grad=True)
    mean = (weight * target).sum() / weight.sum()
    bias = torch.logit(mean.clamp(1e-4, 1 - 1e-4)).detach().clone().requires_grad_()
    params = [w_a, w_b, bias] + ([emb_a, emb_b] if interaction else [])
    optimizer = torch.optim.Adam(params, lr=config.learning_rate)

    def logit(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = bias + w_a[x] + w_b[y]
        if interaction:
            out = out + (emb_a[x] * emb_b[y]).sum(-1)
        return out

    def predict(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logit(x, y))

    # Binomial log-likelihood of clk = imp * target out of imp trials, plus the Gaussian prior;
    # divided by the impressions so the learning rate does not depend on the log's size.
    total = weight.sum()
    nodes = [w_a, w_b] + ([emb_a, emb_b] if interaction else [])
    for _ in range(config.steps):
        optimizer.zero_grad()
        nll = torch.nn.functional.binary_cross_entropy_with_logits(
            logit(a, b), target, weight=weight, reduction="sum"
        )
        prior = config.prior_impressions * sum((p**2).sum() for p in nodes)
        loss = (nll + prior) / total
        loss.backward()
        optimizer.step()
    return predict


def evaluate(
    frame: pd.DataFrame,
    *,
    keys: tuple[str, str],
    target: str,
    weight: str,
    config: LearnedCrossConfig,
) -> dict[str, Any]:
    """Fit on a random split of ``frame``'s pairs; score held-out pairs; compare storage."""
    codes_a, nodes_a = pd.factorize(frame[keys[0]])
    codes_b, nodes_b = pd.factorize(frame[keys[1]])
    rng = np.random.default_rng(config.seed)
    held = rng.random(len(frame)) < config.holdout_fraction
    tensor = {
        "a": torch.as_tensor(codes_a, dtype=torch.long),
        "b": torch.as_tensor(codes_b, dtype=torch.long),
        "y": torch.as_tensor(frame[target].to_numpy(), dtype=torch.float32),
        "w": torch.as_tensor(frame[weight].to_numpy(), dtype=torch.float32),
    }
    train = torch.as_tensor(~held)
    test = torch.as_tensor(held)
    sizes = (len(nodes_a), len(nodes_b))
    scores: dict[str, Any] = {}
    for name, interaction in (("learned", True), ("additive", False)):
        predict = _fit(
            tensor["a"][train],
            tensor["b"][train],
            tensor["y"][train],
            tensor["w"][train],
            sizes,
            config,
            interaction,
        )
        with torch.no_grad():
            got = predict(tensor["a"][test], tensor["b"][test]).numpy()
        want = tensor["y"][test].numpy()
        scores[name] = {
            "spearman": float(pd.Series(got).corr(pd.Series(want), method="spearman")),
            "rmse": float(np.sqrt(np.mean((got - want) ** 2))),
        }
    # Explicit: per pair two keys (8 bytes each) + one float32 value; learned: per node an
    # embedding + a bias term (float32), plus the same 8-byte key to look it up.
    explicit_bytes = len(frame) * (8 + 8 + 4)
    learned_bytes = (sizes[0] + sizes[1]) * (8 + 4 * (config.dim + 1))
    return {
        "pairs": len(frame),
        "held_out_pairs": int(held.sum()),
        "nodes": list(sizes),
        "explicit_bytes": explicit_bytes,
        "learned_bytes": learned_bytes,
        "storage_saving": 1.0 - learned_bytes / explicit_bytes,
        **scores,
    }


def _spearman(got: np.ndarray, want: np.ndarray) -> float:
    return float(pd.Series(got).corr(pd.Series(want), method="spearman"))


def blend(
    explicit: np.ndarray, learned: np.ndarray, impressions: np.ndarray, prior: float
) -> np.ndarray:
    """The explicit CTR shrunk toward the learned one: the learned value counts as ``prior``
    impressions beside the pair's own ``impressions``."""
    weight = impressions / (impressions + prior)
    return weight * explicit + (1.0 - weight) * learned


def rare_pair_scores(
    before: pd.DataFrame,
    after: pd.DataFrame,
    *,
    pair: str,
    keys: tuple[str, str],
    fit_window: int = 30,
    later_window: int = 7,
    rare_max: int = 2,
    config: LearnedCrossConfig | None = None,
    blend_prior: float = 1.0,
) -> dict[str, Any]:
    """Learned cross features vs the additive baseline on rare pairs, judged by the future.

    ``before`` and ``after`` are two partitions of pair ``pair`` (the engine's columns). Both
    models are fitted on every pair of ``before`` with an impression in its ``fit_window``
    window (target the smoothed CTR, weight the impressions). A pair is *rare* when it has
    1..``rare_max`` impressions there; its later value is its smoothed CTR over
    ``after``'s ``later_window`` window, for the rare pairs with an impression in it. That
    window must not overlap ``before``'s (``after`` at least ``later_window`` days later).

    Returns ``learned_cross_rare_pair_spearman`` and ``additive_rare_pair_spearman`` (rank
    correlation of each model's prediction with the later value), ``explicit_rare_pair_spearman``
    (the same for the rare pair's own smoothed CTR in ``before``), ``blend_rare_pair_spearman``
    (the same for :func:`blend`: the explicit CTR shrunk toward the learned prediction, a pair
    with ``n`` impressions weighting its own CTR by ``n / (n + blend_prior)``), the counts and
    the windows.
    """
    config = config or LearnedCrossConfig()
    if rare_max < 1:
        raise ValueError(f"rare_max must be >= 1, got {rare_max}")
    if not blend_prior > 0:
        raise ValueError(
            f"blend_prior must be > 0 (impressions the learned value counts as), got {blend_prior}"
        )
    imp, ctr = f"{pair}_imp_{fit_window}d", f"{pair}_ctr_{fit_window}d"
    later_imp, later_ctr = f"{pair}_imp_{later_window}d", f"{pair}_ctr_{later_window}d"
    for name, frame, columns in (
        ("before", before, [imp, ctr]),
        ("after", after, [later_imp, later_ctr]),
    ):
        lacking = [c for c in [*keys, *columns] if c not in frame.columns]
        if lacking:
            raise ValueError(f"{name} partition lacks columns {lacking}")
    if "event_timestamp" in before and "event_timestamp" in after and len(before) and len(after):
        gap = (
            pd.to_datetime(after["event_timestamp"]).min()
            - pd.to_datetime(before["event_timestamp"]).max()
        )
        if gap < pd.Timedelta(days=later_window):
            raise ValueError(
                f"the later partition is {gap} after the fitted one: its {later_window}-day "
                "window overlaps the fitted window (the later value would not be later)"
            )
    fitted = before[before[imp] > 0].reset_index(drop=True)
    codes_a, nodes_a = pd.factorize(fitted[keys[0]])
    codes_b, nodes_b = pd.factorize(fitted[keys[1]])
    a = torch.as_tensor(codes_a, dtype=torch.long)
    b = torch.as_tensor(codes_b, dtype=torch.long)
    target = torch.as_tensor(fitted[ctr].to_numpy(), dtype=torch.float32)
    weight = torch.as_tensor(fitted[imp].to_numpy(), dtype=torch.float32)
    sizes = (len(nodes_a), len(nodes_b))
    later = after.loc[after[later_imp] > 0, [*keys, later_ctr]].rename(
        columns={later_ctr: "_later"}
    )
    rare = fitted.assign(_row=np.arange(len(fitted)))
    rare = rare[rare[imp] <= rare_max].merge(later, on=list(keys), how="inner")
    rows = torch.as_tensor(rare["_row"].to_numpy(), dtype=torch.long)
    want = rare["_later"].to_numpy(np.float64)
    predictions: dict[str, np.ndarray] = {}
    for name, interaction in (("learned_cross", True), ("additive", False)):
        predict = _fit(a, b, target, weight, sizes, config, interaction)
        with torch.no_grad():
            predictions[name] = predict(a[rows], b[rows]).numpy().astype(np.float64)
    explicit = rare[ctr].to_numpy(np.float64)
    predictions["explicit"] = explicit
    predictions["blend"] = blend(
        explicit, predictions["learned_cross"], rare[imp].to_numpy(np.float64), blend_prior
    )
    scores = {
        f"{name}_rare_pair_spearman": _spearman(got, want) if len(rare) > 1 else None
        for name, got in predictions.items()
    }
    return {
        **scores,
        "blend_prior_impressions": blend_prior,
        "rare_pairs": len(rare),
        "rare_max_impressions": rare_max,
        "fitted_pairs": len(fitted),
        "nodes": list(sizes),
        "fit_window_days": fit_window,
        "later_window_days": later_window,
    }


def learned_pair_ctr(
    partition: pd.DataFrame,
    *,
    pair: str,
    keys: tuple[str, str],
    window: int = 30,
    config: LearnedCrossConfig | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Fit the learned cross model on every pair of one partition (window ``window``) and
    return ``(predict, facts)``: ``predict(frame)`` gives the learned CTR of each row of a
    frame holding the two key columns (NaN where a key is no node of the fit: nothing was
    learned about it), and ``facts`` the nodes and pairs fitted. A pair never seen together
    still gets a value when both keys were seen with others: what the learned form is for.

    Point in time: the partition's statistics end at its ``ds``, so rows of day ``ds`` scored
    with it see nothing of their own day."""
    config = config or LearnedCrossConfig()
    imp, ctr = f"{pair}_imp_{window}d", f"{pair}_ctr_{window}d"
    lacking = [c for c in [*keys, imp, ctr] if c not in partition.columns]
    if lacking:
        raise ValueError(f"partition of pair {pair!r} lacks columns {lacking}")
    fitted = partition[partition[imp] > 0].reset_index(drop=True)
    if fitted.empty:
        raise ValueError(f"partition of pair {pair!r} has no pair seen in its {window}-day window")
    codes_a, nodes_a = pd.factorize(fitted[keys[0]])
    codes_b, nodes_b = pd.factorize(fitted[keys[1]])
    threads = torch.get_num_threads()
    # Small full-batch steps: one thread is faster than many contending on a busy machine
    # (seen 10 ms per step instead of ~1 ms under load).
    torch.set_num_threads(1)
    try:
        model = _fit(
            torch.as_tensor(codes_a, dtype=torch.long),
            torch.as_tensor(codes_b, dtype=torch.long),
            torch.as_tensor(fitted[ctr].to_numpy(), dtype=torch.float32),
            torch.as_tensor(fitted[imp].to_numpy(), dtype=torch.float32),
            (len(nodes_a), len(nodes_b)),
            config,
            True,
        )
    finally:
        torch.set_num_threads(threads)

    def predict(frame: pd.DataFrame) -> np.ndarray:
        a = nodes_a.get_indexer(pd.Index(frame[keys[0]]))
        b = nodes_b.get_indexer(pd.Index(frame[keys[1]]))
        known = (a >= 0) & (b >= 0)
        out = np.full(len(frame), np.nan)
        if known.any():
            with torch.no_grad():
                got = model(
                    torch.as_tensor(a[known], dtype=torch.long),
                    torch.as_tensor(b[known], dtype=torch.long),
                )
            out[known] = got.numpy().astype(np.float64)
        return out

    return predict, {"pairs": len(fitted), "nodes": [len(nodes_a), len(nodes_b)]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_learned_cross")
    parser.add_argument("--features", type=Path, required=True, help="one pair's dt= folder")
    parser.add_argument("--pair", required=True, help="the pair's name (column prefix)")
    parser.add_argument("--keys", nargs=2, required=True, help="its two key columns")
    parser.add_argument("--window", type=int, default=30, help="window in days (default 30)")
    parser.add_argument(
        "--later",
        type=Path,
        help="a later dt= folder of the same pair: score rare pairs against it instead",
    )
    parser.add_argument("--later-window", type=int, default=7, help="its window (default 7)")
    parser.add_argument("--rare-max", type=int, default=2, help="rare: <= this many impressions")
    args = parser.parse_args(argv)
    frame = pd.read_parquet(args.features)
    if args.later is not None:
        result = rare_pair_scores(
            frame,
            pd.read_parquet(args.later),
            pair=args.pair,
            keys=(args.keys[0], args.keys[1]),
            fit_window=args.window,
            later_window=args.later_window,
            rare_max=args.rare_max,
        )
        print(json.dumps(result, indent=2))
        return result
    result = evaluate(
        frame,
        keys=(args.keys[0], args.keys[1]),
        target=f"{args.pair}_ctr_{args.window}d",
        weight=f"{args.pair}_imp_{args.window}d",
        config=LearnedCrossConfig(),
    )
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
