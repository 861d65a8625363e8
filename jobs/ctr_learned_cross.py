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
    weight_decay: float = 1e-4
    """L2 on the embeddings: rare nodes stay near zero instead of fitting noise."""
    holdout_fraction: float = 0.2
    """Share of pairs held out for scoring."""
    seed: int = 0
    """Seed of the split and the initialisation."""

    def __post_init__(self) -> None:
        if self.dim < 1 or self.steps < 1 or self.learning_rate <= 0:
            raise ValueError("dim and steps must be >= 1 and learning_rate > 0")
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
    emb_a = (torch.randn(sizes[0], config.dim, generator=generator) * 0.01).requires_grad_()
    emb_b = (torch.randn(sizes[1], config.dim, generator=generator) * 0.01).requires_grad_()
    w_a = torch.zeros(sizes[0], requires_grad=True)
    w_b = torch.zeros(sizes[1], requires_grad=True)
    bias = torch.logit(target.mean()).detach().clone().requires_grad_()
    params = [w_a, w_b, bias] + ([emb_a, emb_b] if interaction else [])
    optimizer = torch.optim.Adam(params, lr=config.learning_rate)

    def predict(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logit = bias + w_a[x] + w_b[y]
        if interaction:
            logit = logit + (emb_a[x] * emb_b[y]).sum(-1)
        return torch.sigmoid(logit)

    for _ in range(config.steps):
        optimizer.zero_grad()
        loss = (weight * (predict(a, b) - target) ** 2).sum() / weight.sum()
        loss = loss + config.weight_decay * sum((p**2).sum() for p in params)
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m jobs.ctr_learned_cross")
    parser.add_argument("--features", type=Path, required=True, help="one pair's dt= folder")
    parser.add_argument("--pair", required=True, help="the pair's name (column prefix)")
    parser.add_argument("--keys", nargs=2, required=True, help="its two key columns")
    parser.add_argument("--window", type=int, default=30, help="window in days (default 30)")
    args = parser.parse_args(argv)
    frame = pd.read_parquet(args.features)
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
