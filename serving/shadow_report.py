"""The shadow report: the challenger beside the champion on the same requests of a serving day.

python -m serving.shadow_report --ds 2026-11-22
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from serving.monitor import online_auc


def shadow_report(frame: Any) -> dict[str, Any]:
    """Compare champion and shadow (challenger) scores logged on the same candidates:
    agreement of the top candidate per request, score correlation, and online AUC of each
    when clicks are joined. ``frame`` is :func:`serving.feedback_read.load_joined_feedback`'s."""
    shadowed = frame[frame["shadow_score"].notna()] if "shadow_score" in frame else frame.iloc[:0]
    if shadowed.empty:
        raise ValueError("no shadow scores logged; start serving with CASCADE_SHADOW_ALIAS set")
    top_champion = shadowed.loc[shadowed.groupby("request_id")["score"].idxmax(), "item_id"]
    top_shadow = shadowed.loc[shadowed.groupby("request_id")["shadow_score"].idxmax(), "item_id"]
    report: dict[str, Any] = {
        "requests": int(shadowed["request_id"].nunique()),
        "candidates": len(shadowed),
        "champion_versions": sorted(map(str, shadowed["model_version"].unique())),
        "shadow_versions": sorted(map(str, shadowed["shadow_version"].unique())),
        "top1_agreement": float(np.mean(top_champion.to_numpy() == top_shadow.to_numpy())),
        "score_correlation": float(
            np.corrcoef(shadowed["score"], shadowed["shadow_score"].astype(float))[0, 1]
        ),
        "mean_abs_score_diff": float(
            np.mean(np.abs(shadowed["score"] - shadowed["shadow_score"].astype(float)))
        ),
    }
    if "click" in shadowed:
        report["champion_online_auc"] = online_auc(shadowed["score"], shadowed["click"])
        report["shadow_online_auc"] = online_auc(shadowed["shadow_score"], shadowed["click"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ds", required=True, help="serving day YYYY-MM-DD")
    args = parser.parse_args(argv)
    from serving.feedback_read import load_joined_feedback

    print(json.dumps(shadow_report(load_joined_feedback(args.ds)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
