"""Benchmark ``preranking``: the three models' quality, DeepSpeed vs plain PyTorch, scoring cost.

    cascade bench preranking --out bench-results/preranking.json          # ml100k, ~10 min
    cascade bench preranking --out /tmp/p.json --quick                     # smoke, < 30 s
    CASCADE_BENCH_PRERANKING_CONFIG=generated cascade bench preranking --out FILE
    cascade bench preranking --config ml100k --seeds 0,1,2 --out FILE   # one run per seed

The full run trains the cascade (teacher, two-tower, FSCD sweep) with 2 processes through
:func:`models.preranking.cascade_train.launch_cascade` and copies its headline metrics
(``teacher_auc``, ``fscd_auc``, ``two_tower_auc``, ``auc_ratio``, ``cost_ratio``, ``fscd_gauc``,
``recall_at_k``, and ``fscd_strength``, the λ chosen on the validation split, with
``fscd_validation_auc``; with several seeds, medians, min/max, ``per_seed`` and ``goals_held``).
Training logs to the local stack's MLflow when it runs, else to a SQLite store in the run folder.
Then it measures teacher training throughput on one process,
DeepSpeed against a plain ``torch.optim`` loop interleaved in the same process, same batch
size and steps, warm-up excluded (``ds_vs_torch_throughput``, wall-clock medians of 7;
``ds_vs_torch_cpu_time`` the same from process CPU time), DeepSpeed on 1 vs 2
processes, and for the record the same ratio under ZeRO-1 (``ds_vs_torch_throughput_zero1``);
and the eager scoring cost of 1 user x 1,000 / 10,000 candidates with the user part shared
(``score_request``) against scoring every candidate row in full.

With ``--config generated`` (with ``--quick``: on a tiny log, one seed) it also reports what
the cross features add: ``auc_with_cross``, ``auc_without_cross``, ``cross_lift``,
``cross_fields_kept``, ``learned_cross_rare_pair_spearman``, ``additive_rare_pair_spearman``,
``cross_setup`` and ``cross_provenance`` (see :mod:`benchmarks.preranking_cross`).

Honest definitions beside the headline keys: ``cost_ratio`` is not a measured cost but the
field-weight sum FSCD's regularizer minimizes (kept fields weighted by their cost, over the
teacher's; the networks' layers count for nothing), also reported as ``feature_cost_ratio``;
the measured cost is ``latency_ratio_fscd_vs_teacher``, FSCD's per-request scoring latency
over the teacher's at 1 user x 1,000 candidates (:func:`request_latency`: each model's
``*_request_ms`` and ``*_request_flops``, the two-tower's too). Each ``*_goal_met`` tests the
figure against the goal of :data:`GOALS`, the goals the docs state.

``model_digest`` is what the quality figures came from: one digest over every seed's trained
networks (each run folder's ``phases/*/model.pt`` and the deployed ``fscd_model/``; per seed
in ``model_provenance.per_seed``). ``model_provenance`` holds the config (its name and every
value), the seeds and ``rows_digest``, the digest of the labelled rows the config trains on
(:func:`benchmarks.provenance.frame_digest`), plus ``scoring_model_digest``, the weights of
the network the scoring cost is timed on (initialized from torch seed 0, untrained: the cost
does not depend on the weights). ``--quick`` trains no cascade, so there ``model_digest`` is
that scoring network's.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.goals import goal, goals_of
from benchmarks.kept_trainings import KeptTrainings, keep_root
from benchmarks.provenance import digest_of, files_digest, frame_digest, weights_digest
from cascade.config import Settings, load_settings
from cascade.progress import track
from cascade.training.resumable_run import reachable_tracking
from compilers.export import torch_threads
from compilers.timing import interleaved_ms, median_seconds
from models.preranking.cascade_train import launch_cascade
from models.preranking.config_registry import get_cascade_config
from models.preranking.fields import FIELDS, FieldEncoder
from models.preranking.model import ColdPreRanker, DCNTeacher, TwoTower

SCORING_SEED = 0
"""Torch seed of the (untrained) network the scoring cost is timed on."""
TRAINED_MODEL_FILES = ("phases", "fscd_model")
"""What a cascade run folder holds of its trained networks: every phase's ``model.pt`` and the
deployed FSCD model."""
CROSS_CONFIG = "generated"
"""With this config the run also trains FSCD with and without the cross-statistics engine's
fields on one generated log (:mod:`benchmarks.preranking_cross`); with ``--quick`` on a tiny
log, one seed (the rest of a quick run still uses ``debug``)."""
SEEDS_ENV = "CASCADE_BENCH_PRERANKING_SEEDS"
"""Comma-separated training seeds of the full run (default ``0``); one cascade per seed."""
HEADLINE = (
    "teacher_auc",
    "fscd_auc",
    "two_tower_auc",
    "auc_ratio",
    "cost_ratio",
    "fscd_gauc",
    "recall_at_k",
)
"""Per-seed metrics whose median over the seeds is the headline figure."""
GOALS: dict[str, tuple[str, float]] = {g.figure: (g.op, g.bound) for g in goals_of("preranking")}
"""The goals the docs state, per figure (:data:`benchmarks.goals.GOALS`, where the page's
statement of them comes from too). The measured latency has no goal. ``*_goal_met`` is each
figure (the median over the seeds) against its goal."""


def bench_seeds() -> list[int]:
    return list(load_settings().bench.preranking_seeds)


def summarize_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline keys = medians over the seeds' runs; the other keys (kept fields, λ, run folder)
    are those of the run with the median FSCD AUC. Adds each key's min and max, the per-seed
    table, and on how many seeds each goal held."""
    by_fscd = sorted(runs, key=lambda run: float(run["fscd_auc"]))
    middle = by_fscd[(len(by_fscd) - 1) // 2]
    summary: dict[str, Any] = {k: v for k, v in middle.items() if k != "config"}
    for key in HEADLINE:
        values = sorted(float(run[key]) for run in runs)
        summary[key] = float(statistics.median(values))
        summary[f"{key}_min"] = values[0]
        summary[f"{key}_max"] = values[-1]
    # The field-weight sum FSCD minimizes, under its own name (``cost_ratio`` kept as it was).
    for suffix in ("", "_min", "_max"):
        summary[f"feature_cost_ratio{suffix}"] = summary[f"cost_ratio{suffix}"]
    summary["seeds"] = [int(run["seed"]) for run in runs]
    summary["per_seed"] = [
        {
            "seed": int(run["seed"]),
            **{k: float(run[k]) for k in HEADLINE},
            **({"model_digest": run["model_digest"]} if "model_digest" in run else {}),
        }
        for run in runs
    ]
    summary["fscd_margin_over_two_tower"] = [
        float(run["fscd_auc"]) - float(run["two_tower_auc"]) for run in runs
    ]
    auc, cost = goal("preranking", "auc_ratio"), goal("preranking", "feature_cost_ratio")
    summary["goals_held"] = {
        f"auc_ratio_ge_{auc.bound:g}": sum(auc.met(float(run["auc_ratio"])) for run in runs),
        f"cost_ratio_le_{cost.bound:g}": sum(cost.met(float(run["cost_ratio"])) for run in runs),
        f"feature_cost_ratio_le_{cost.bound:g}": sum(
            cost.met(float(run["cost_ratio"])) for run in runs
        ),
        "fscd_beats_two_tower": sum(
            float(run["fscd_auc"]) > float(run["two_tower_auc"]) for run in runs
        ),
        "of": len(runs),
    }
    return summary


def train_seeds(
    config_name: str, out: Path, seeds: list[int], kept: KeptTrainings | None = None
) -> dict[str, Any]:
    """Train the cascade once per seed (2 processes) and summarize the runs; with a keep
    folder, a seed's training kept at this commit is reused (:mod:`benchmarks.kept_trainings`)."""
    kept = kept or KeptTrainings(None)
    runs = []
    for seed in track(seeds, desc="bench preranking seeds", unit="seeds"):
        if kept.root is None:
            run_dir = out.parent / f"{out.stem}-run" / f"seed{seed}"
        else:
            run_dir = kept.root / "seeds" / f"{config_name}-seed{seed}"

        def trained(run_dir: Path = run_dir, seed: int = seed) -> dict[str, Any]:
            settings = tracking_settings(run_dir)
            print(
                f"[bench] preranking {config_name} seed {seed}: training in {run_dir}", flush=True
            )
            code, tail = launch_cascade(
                config_name,
                run_dir,
                processes=2,
                settings=settings,
                extra_args=["--seed", str(seed)],
            )
            result = _read(run_dir / "result.json", f"cascade training (exit {code})", tail)
            result.update(
                seed=seed,
                run_dir=str(run_dir),
                mlflow_uri=settings.tracking_uri,
                model_digest=trained_models_digest(run_dir),
            )
            return result

        inputs = {"training": "seeds", "config": config_name, "seed": seed, "processes": 2}
        runs.append(kept.run(run_dir, inputs, trained))
    return summarize_seeds(runs)


def trained_models_digest(run_dir: Path) -> str:
    """Digest of a cascade run's trained networks (:data:`TRAINED_MODEL_FILES` that exist)."""
    found = [run_dir / name for name in TRAINED_MODEL_FILES if (run_dir / name).exists()]
    if not found:
        raise FileNotFoundError(f"cascade run {run_dir} left none of {TRAINED_MODEL_FILES}")
    return files_digest(found)


def model_record(
    result: dict[str, Any], config_name: str, *, rows_digest: str, rows: int, scoring_digest: str
) -> tuple[str, dict[str, Any]]:
    """``(model_digest, model_provenance)`` of a run (see the module docstring)."""
    provenance: dict[str, Any] = {
        "config": config_name,
        "config_values": get_cascade_config(config_name).to_dict(),
        "rows_digest": rows_digest,
        "rows": rows,
        "scoring_model_digest": scoring_digest,
        "scoring_model": f"ColdPreRanker initialized from torch seed {SCORING_SEED}, untrained",
    }
    per_seed = [row for row in result.get("per_seed", []) if "model_digest" in row]
    if not per_seed:
        return scoring_digest, provenance | {"source": "initialized (no cascade trained)"}
    seeds = {str(row["seed"]): row["model_digest"] for row in per_seed}
    provenance |= {
        "source": "trained",
        "seeds": [row["seed"] for row in per_seed],
        "per_seed": seeds,
        "models": "per seed: " + " + ".join(TRAINED_MODEL_FILES) + " of its run folder",
    }
    return digest_of(seeds.values()), provenance


def _read(path: Path, what: str, log_tail: str) -> dict[str, Any]:
    if not path.exists():
        raise RuntimeError(f"{what} wrote no {path}; last log lines:\n{log_tail}")
    return dict(json.loads(path.read_text()))


def tracking_settings(run_dir: Path) -> Settings:
    """The settings the training runs log with: the local stack's MLflow server when it
    answers, else a private SQLite store in ``run_dir`` (the benchmark needs no stack)."""
    return reachable_tracking(load_settings(), run_dir, fallback=True, who="bench")


def throughput(
    config: str, processes: int, steps: int, work: Path, *, zero_stage: int | None = None
) -> dict[str, Any]:
    """Teacher training samples/s on ``processes`` processes (and the plain loop on one);
    ``zero_stage`` overrides the config's."""
    out = work / f"throughput-{config}-{processes}-{zero_stage}"
    stage = [] if zero_stage is None else ["--zero-stage", str(zero_stage)]
    # One thread per process in both cases: with 2 OpenMP threads on a loaded 2-core machine
    # the 1-process loop waited on its second thread and measured 5-25x slower than 2 processes.
    code, tail = launch_cascade(
        config,
        out,
        processes=processes,
        extra_args=["--throughput-steps", str(steps), *stage],
        extra_env={"OMP_NUM_THREADS": "1"},
    )
    result = _read(out / "throughput.json", f"throughput run (exit {code})", tail)
    return result


def scoring_cost(
    fields: tuple[str, ...], encoder: FieldEncoder, config_name: str, candidates: int, repeats: int
) -> dict[str, Any]:
    """Median ms to score one user x ``candidates`` items, user part shared vs recomputed, and
    the scored network's ``weights_digest``."""
    config = get_cascade_config(config_name)
    torch.manual_seed(SCORING_SEED)
    model = ColdPreRanker(
        config.net, fields, encoder.cardinalities(), field_set=encoder.fields
    ).eval()
    cards = torch.tensor(encoder.cardinalities())
    codes = (torch.rand(candidates, len(encoder.fields)) * cards).long()
    user = codes[0]
    rows = codes.clone()
    user_positions = [i for i, f in enumerate(encoder.fields) if f.kind == "user"]
    rows[:, user_positions] = user[user_positions]
    # One request, one core: the serving worker's budget.
    with torch_threads(1), torch.inference_mode():
        shared = median_seconds(lambda: model.score_request(user, codes), repeats=repeats)
        full = median_seconds(lambda: model(rows), repeats=repeats)
        torch.testing.assert_close(model.score_request(user, codes), model(rows))
    return {
        "shared_user_ms": shared * 1e3,
        "per_row_ms": full * 1e3,
        "speedup": full / shared,
        "weights_digest": weights_digest(model),
    }


def request_latency(
    fields: tuple[str, ...],
    encoder: FieldEncoder,
    config_name: str,
    candidates: int,
    *,
    rounds: int,
    repeats: int,
) -> dict[str, Any]:
    """Per-request scoring latency of 1 user x ``candidates`` items, one thread, for the three
    models as each would serve: the teacher (DCN-v2 over every field, every row in full), FSCD
    (``fields``, the user part once: :meth:`ColdPreRanker.score_request`) and the two-tower
    (the user tower once, the item tower per candidate). Medians over interleaved rounds, each
    the median of ``repeats`` calls, and each model's FLOPs per request
    (:class:`torch.utils.flop_counter.FlopCounterMode`: matrix products; embedding lookups and
    elementwise work count nothing). Untrained networks: the cost does not depend on the
    weights."""
    from torch.utils.flop_counter import FlopCounterMode

    config = get_cascade_config(config_name)
    cards = encoder.cardinalities()
    every = encoder.fields.names
    torch.manual_seed(SCORING_SEED)
    teacher = DCNTeacher(config.net, every, cards, field_set=encoder.fields).eval()
    fscd = ColdPreRanker(config.net, fields, cards, field_set=encoder.fields).eval()
    two_tower = TwoTower(config.net, every, cards, field_set=encoder.fields).eval()
    codes = (torch.rand(candidates, len(every)) * torch.tensor(cards)).long()
    user = codes[0]
    rows = codes.clone()
    user_positions = [i for i, f in enumerate(encoder.fields) if f.kind == "user"]
    rows[:, user_positions] = user[user_positions]

    def towers() -> torch.Tensor:
        u = two_tower.user_tower(two_tower.user_embedding(user[two_tower.user_index]).flatten())
        items = two_tower.item_embedding(codes[:, two_tower.item_index]).flatten(1)
        return two_tower.item_tower(items) @ u + two_tower.bias

    variants = {
        "teacher": lambda: teacher(rows),
        "fscd": lambda: fscd.score_request(user, codes),
        "two_tower": towers,
    }
    with torch_threads(1), torch.inference_mode():
        torch.testing.assert_close(towers(), two_tower(rows))
        flops = {}
        for name, fn in variants.items():
            with FlopCounterMode(display=False) as counter:
                fn()
            flops[name] = int(counter.get_total_flops())
        ms = interleaved_ms(variants, rounds=rounds, repeats=repeats)
    return {
        "latency_ratio_fscd_vs_teacher": ms["fscd"] / ms["teacher"],
        "latency_ratio_two_tower_vs_teacher": ms["two_tower"] / ms["teacher"],
        **{f"{name}_request_ms": value for name, value in ms.items()},
        **{f"{name}_request_flops": value for name, value in flops.items()},
        "flops_ratio_fscd_vs_teacher": flops["fscd"] / flops["teacher"]
        if flops["teacher"]
        else None,
        "request_latency_setup": {
            "candidates": candidates,
            "rounds": rounds,
            "repeats": repeats,
            "threads": 1,
            "fscd_fields": len(fields),
            "teacher_fields": len(every),
            "flops": "FlopCounterMode total per request (matrix products only)",
        },
    }


def goals_met(result: dict[str, Any]) -> dict[str, bool]:
    """Every ``*_goal_met`` key: each figure present against the goal the docs state
    (:data:`GOALS`)."""
    met = {}
    for stated in goals_of("preranking"):
        value = result.get(stated.figure)
        if isinstance(value, int | float) and not isinstance(value, bool):
            met[stated.key] = stated.met(value)
    return met


def run(out: Path, quick: bool) -> dict[str, Any]:
    config_name = "debug" if quick else load_settings().bench.preranking_config
    result: dict[str, Any] = {"config": config_name, "quick": quick}
    kept = KeptTrainings(keep_root())
    with tempfile.TemporaryDirectory(prefix="bench-preranking-") as tmp:
        work = Path(tmp) if kept.root is None else kept.root
        fields: tuple[str, ...] = FIELDS.names
        if not quick:
            result.update(train_seeds(config_name, out, bench_seeds(), kept))
            fields = tuple(result["fscd_fields"])
        if load_settings().bench.preranking_config == CROSS_CONFIG:
            from benchmarks.preranking_cross import FULL, QUICK, cross_comparison

            seeds = [SCORING_SEED] if quick else bench_seeds()
            setup = QUICK if quick else FULL
            result.update(cross_comparison(work / "cross", seeds, setup, kept))
        steps = 10 if quick else 200
        one = throughput(config_name, 1, steps, work)
        result["torch_samples_per_s"] = one["torch_samples_per_s"]
        result["deepspeed_samples_per_s_1proc"] = one["deepspeed_samples_per_s"]
        result["ds_vs_torch_throughput"] = one["ds_vs_torch_throughput"]
        result["ds_vs_torch_cpu_time"] = one["ds_vs_torch_cpu_time"]
        result["throughput_setup"] = {
            k: one.get(k)
            for k in (
                "steps",
                "repeats",
                "batch_size",
                "zero_stage",
                "precision",
                "torch_cpu_ms_per_step",
                "deepspeed_cpu_ms_per_step",
                "load_average_before",
                "load_average_after",
            )
        }
        if not quick:
            two = throughput(config_name, 2, steps, work)
            result["deepspeed_samples_per_s_2proc"] = two["deepspeed_samples_per_s"]
            result["two_vs_one_process"] = (
                two["deepspeed_samples_per_s"] / one["deepspeed_samples_per_s"]
            )
            # The configuration not chosen, for the record: ZeRO-1 on the same loops.
            if one["zero_stage"] != 1:
                zero1 = throughput(config_name, 1, steps, work, zero_stage=1)
                result["ds_vs_torch_throughput_zero1"] = zero1["ds_vs_torch_throughput"]
    from models.preranking.fscd_data import load_frame
    from models.preranking.training_set import time_split

    config = get_cascade_config(config_name)
    frame = load_frame(config)
    encoder = FieldEncoder(bins=config.bins).fit(time_split(frame, 0.2)[0])
    result["scoring_fields"] = list(fields)
    scoring_digest = ""
    for candidates in (1_000,) if quick else (1_000, 10_000):
        cost = scoring_cost(fields, encoder, config_name, candidates, 5 if quick else 30)
        result[f"score_{candidates}_ms"] = cost["shared_user_ms"]
        result[f"score_{candidates}_per_row_ms"] = cost["per_row_ms"]
        result[f"score_{candidates}_shared_speedup"] = cost["speedup"]
        scoring_digest = cost["weights_digest"]
    result.update(
        request_latency(
            fields,
            encoder,
            config_name,
            1_000,
            rounds=3 if quick else 7,
            repeats=3 if quick else 15,
        )
    )
    result.update(goals_met(result))
    result["kept_trainings"] = kept.summary()
    result["model_digest"], result["model_provenance"] = model_record(
        result,
        config_name,
        rows_digest=frame_digest(frame),
        rows=len(frame),
        scoring_digest=scoring_digest,
    )
    return result
