"""Retrieval evaluation of the image-text model: image->text and text->image recall@1/5 on a
held-out split, and the dense and MoE runs side by side with quality per unit of compute.

    cascade multimodal evaluate --config debug [--corpus CORPUS] --out OUT

trains the MoE config and its dense twin (same active parameters) with
:func:`models.multimodal.train.train_multimodal` and writes ``OUT/comparison.json``.

Recall@k: query i is a hit when its own pair is among the top k of the other modality. When
``groups`` are given (pairs with identical captions share a group), any item of the query's
group counts: the generator draws the same described content many times, and a caption that
fits two images equally cannot tell them apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.multimodal.model import ImageTextTransformer
from models.multimodal.pairs import Pairs


def recall_at_k(
    similarity: np.ndarray, ks: tuple[int, ...] = (1, 5), groups: np.ndarray | None = None
) -> dict[str, float]:
    """``i2t_r@k`` / ``t2i_r@k`` from an ``(images, texts)`` similarity matrix whose diagonal
    holds the true pairs."""
    sim = np.asarray(similarity, dtype=np.float64)
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1] or sim.shape[0] == 0:
        raise ValueError(f"similarity must be a non-empty square matrix, got {sim.shape}")
    n = sim.shape[0]
    group = np.arange(n) if groups is None else np.asarray(groups)
    result: dict[str, float] = {}
    for name, scores in (("i2t", sim), ("t2i", sim.T)):
        # Stable order: ties go to the lower index, never to the true pair by luck.
        order = np.argsort(-scores, axis=1, kind="stable")
        hit = group[order] == group[:, None]
        for k in ks:
            result[f"{name}_recall_at_{k}"] = float(hit[:, :k].any(axis=1).mean())
    return result


@torch.no_grad()
def embed(
    model: ImageTextTransformer, pairs: Pairs, batch: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Image and text embeddings of every pair (eval mode)."""
    was_training = model.training
    model.eval()
    device = model.logit_scale.device
    images, texts = [], []
    for start in range(0, len(pairs), batch):
        out = model(
            pairs.images[start : start + batch].to(device),
            pairs.tokens[start : start + batch].to(device),
        )
        images.append(out.image_embedding.float().cpu())
        texts.append(out.text_embedding.float().cpu())
    model.train(was_training)
    return torch.cat(images), torch.cat(texts)


def retrieval_metrics(model: ImageTextTransformer, pairs: Pairs) -> dict[str, float]:
    image, text = embed(model, pairs)
    return recall_at_k((image @ text.T).numpy(), groups=pairs.groups) | {
        "eval_pairs": float(len(pairs)),
        "distinct_captions": float(len(set(pairs.captions))),
    }


def side_by_side(moe: dict[str, Any], dense: dict[str, Any]) -> dict[str, Any]:
    """The two runs' figures in one table, with recall per training PFLOP and per second."""

    def row(result: dict[str, Any]) -> dict[str, Any]:
        r1 = (result["i2t_recall_at_1"] + result["t2i_recall_at_1"]) / 2
        return {
            "config": result["config"],
            "i2t_recall_at_1": result["i2t_recall_at_1"],
            "i2t_recall_at_5": result["i2t_recall_at_5"],
            "t2i_recall_at_1": result["t2i_recall_at_1"],
            "t2i_recall_at_5": result["t2i_recall_at_5"],
            "mean_recall_at_1": r1,
            "active_params": result["active_params"],
            "total_params": result["total_params"],
            "train_seconds": result["train_seconds"],
            "train_pflop": result["train_flops"] / 1e15,
            "recall_at_1_per_pflop": r1 / max(result["train_flops"] / 1e15, 1e-12),
            "recall_at_1_per_train_second": r1 / max(result["train_seconds"], 1e-9),
            "final_loss": result["final_loss"],
        }

    moe_row, dense_row = row(moe), row(dense)
    return {
        "moe": moe_row,
        "dense": dense_row,
        "moe_over_dense_recall_at_1": moe_row["mean_recall_at_1"]
        / max(dense_row["mean_recall_at_1"], 1e-9),
        "moe_over_dense_recall_at_1_per_second": moe_row["recall_at_1_per_train_second"]
        / max(dense_row["recall_at_1_per_train_second"], 1e-12),
        "flops_note": "training FLOPs = 6 x active parameters x tokens (attention not counted)",
    }


def compare(
    config_name: str, corpus: Path | None, out: Path, *, echo: bool = True
) -> dict[str, Any]:
    """Train ``config_name`` (MoE) and its dense twin one after the other; write and return
    ``OUT/comparison.json``."""
    from models.multimodal.config_registry import get_config
    from models.multimodal.train import train_multimodal

    config = get_config(config_name)
    if not config.is_moe:
        raise ValueError(f"config {config_name!r} is dense; name the MoE config of the pair")
    moe = train_multimodal(None, config_name, corpus, out / "moe", echo=echo)
    dense = train_multimodal(None, f"{config_name}-dense", corpus, out / "dense", echo=echo)
    table = side_by_side(moe, dense)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(table, indent=2))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="debug", help="the MoE config (its -dense twin too)")
    parser.add_argument(
        "--corpus", type=Path, default=None, help="corpus folder (default: generator)"
    )
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    print(json.dumps(compare(args.config, args.corpus, args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
