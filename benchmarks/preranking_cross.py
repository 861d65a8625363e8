"""What the cross features add to the pre-ranker: FSCD with and without them, same log, per seed.

Part of ``cascade bench preranking`` (:mod:`benchmarks.preranking_models`) with ``--config
generated`` (:data:`FULL`) and under ``--quick`` (:data:`QUICK`, a tiny log and one short
phase, a smoke test of the path, not a figure)::

    cascade bench preranking --config generated --seeds 0,1,2 --out FILE

A generated impression log (:mod:`jobs.impression_log`, Zipf users and items, known crosses)
goes through the cross-statistics engine for each training day
(:func:`jobs.ctr_training_set.build_engine_training_set`: partition ``D`` for the impressions
of day ``D``, the ``ctr_cross`` DAG's job), which writes ``data.parquet`` and ``fields.json``:
the id fields, the user's and the item's own statistics, every cross statistic and the learned
cross fields, each an FSCD candidate with its cost. Per seed the cascade trains twice on the
same rows: with every field, and without the ``cross`` ones. Keys:

- ``auc_with_cross``, ``auc_without_cross``: median over the seeds of the chosen FSCD model's
  test AUC; ``cross_lift``: median over the seeds of (with - without). The "without" arm drops
  every cross field, ``item_pos`` (item x position) included, so it has no position at all.
- ``cross_lift_same_position``: with - without, where the "without" arm keeps the position
  crosses (:data:`POSITION_KEY` among the pair's keys, ``item_pos_*``): both arms see position,
  only the other crosses differ (``auc_without_cross_same_position``). The honest figure for
  what the crosses add beyond position.
- ``cross_lift_servable``: an arm with only the crosses the server can key (every key among
  :data:`serving.online_fields.SERVED_KEYS`: user, item, genre, so ``user_cat_*``) against the
  arm without any cross (``auc_servable_cross``); neither sees position, which no request
  carries.
- ``pipeline_config_auc_ratio``, ``pipeline_config_feature_cost_ratio``: the deployed
  ``ctr_preranking`` DAG's config (:attr:`CrossSetup.pipeline_config`) trained on the servable
  field set of the same rows (its own training set's shape), FSCD over its teacher, medians
  over the seeds; ``pipeline_config_goal_met`` tests them against the benchmark config's goals.
- The planted effects of the generator (:mod:`jobs.impression_log`) the lift is measured on
  are listed under ``cross_setup.planted`` (:func:`planted`).
- ``cross_lift_by_pair``: a per-pair ablation on the first seed (``cross_ablation`` says
  which): for each cross pair (its explicit statistics and its learned field together), the
  with-cross AUC less that of an arm without that pair only.
- ``ml100k_cross_lift`` (``ml100k_auc_with_cross``, ``ml100k_auc_without_cross``): the same
  with/without comparison on MovieLens-100k, data with no planted structure and no position
  (:func:`ml100k_comparison`: its last :attr:`CrossSetup.ml100k_days` days through the engine,
  the pairs ML-100k can key), median over the seeds; ``ml100k_setup`` holds its sizes, pairs
  and digests.
- ``cross_fields_kept``: the cross fields the chosen FSCD model kept (the seed with the median
  lift; every seed's in ``cross_per_seed``).
- ``learned_cross_rare_pair_spearman``, ``additive_rare_pair_spearman``: the learned cross
  features against the additive baseline on user x genre pairs seen at most ``rare_max`` times
  in the first engine partition, ranked against the same pairs' explicit CTR in a later,
  disjoint window (:func:`jobs.ctr_learned_cross.rare_pair_scores`);
  ``explicit_rare_pair_spearman``, the same for the pair's own explicit statistic (its smoothed
  CTR in the fitted window), and ``blend_rare_pair_spearman``, for the explicit statistic
  shrunk toward the learned prediction by the pair's impressions.
- ``cross_setup``: sizes (impressions, days, rows, fields by kind), the cascade config and its
  λ sweep (shorter than the ``generated`` config's: two trainings per seed), the seeds.
- ``cross_provenance``: digests of the generator and engine code with the setup
  (``input_digest``), the training rows (``rows_digest``), ``fields.json`` and every run's
  trained networks.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.goals import goal
from benchmarks.kept_trainings import KeptTrainings
from benchmarks.provenance import code_digest, digest_of, files_digest, frame_digest
from cascade.config import load_settings
from compilers.export import torch_threads
from jobs import ctr_cross_stats as engine
from jobs.ctr_learned_cross import rare_pair_scores
from jobs.ctr_training_set import build_engine_training_set, published_partitions
from jobs.impression_log import GeneratorConfig
from jobs.spark_sessions import active_or_new
from models.preranking.cascade_train import launch_cascade
from models.preranking.config_registry import get_cascade_config
from models.preranking.fields import FieldSet
from serving.online_fields import SERVED_KEYS

INPUT_CODE = (
    "jobs.impression_log",
    "jobs.ctr_cross_stats",
    "jobs.ctr_training_set",
    "jobs.ctr_learned_cross",
)
"""The modules that make the training set (their sources enter ``input_digest``)."""
RARE_PAIR = ("user_cat", ("user_id", "item_category"))
"""The pair the learned cross features are judged on: user x genre, the sparsest low-rank one."""
POSITION_KEY = "position"
"""The log column a position cross is keyed by (``item_pos``: item x position)."""


def planted(config: GeneratorConfig) -> list[str]:
    """What the generator (:mod:`jobs.impression_log`) plants in the log the lift is measured
    on, from its config: the crosses earn their lift on data built with these effects."""
    rank = config.cross_rank
    return [
        f"position: P(click) = position^-{config.position_decay} x relevance (item_pos)",
        f"user, item: main logit effects, sd {config.user_sigma} and {config.item_sigma}, "
        f"Zipf {config.user_zipf} / {config.item_zipf} popularity (own statistics)",
        f"segment x genre: independent cells, sd {config.seg_cat_sigma} (seg_cat)",
        f"user x genre: rank-{rank}, sd {config.user_cat_sigma} (user_cat)",
        f"segment x item: rank-{rank}, sd {config.seg_item_sigma} (seg_item)",
        f"context x item: rank-{rank}, sd {config.ctx_item_sigma} (ctx_item)",
    ]


GOAL_AUC_RATIO = goal("preranking", "pipeline_config_auc_ratio").bound
"""FSCD's test AUC over its teacher's: the goal the docs state (as for the benchmark config)."""
GOAL_FEATURE_COST_RATIO = goal("preranking", "pipeline_config_feature_cost_ratio").bound
"""FSCD's field-weight sum over the teacher's: the goal the docs state."""


@dataclass(frozen=True, kw_only=True)
class CrossSetup:
    """Sizes of the with/without-cross comparison."""

    impressions: int
    """Rows of the generated log."""
    log_days: int
    """Days the log spans."""
    engine_days: int
    """The last days of the log the engine builds a partition for: the training rows."""
    users: int
    """Distinct user ids the generator draws from."""
    items: int
    """Distinct item ids the generator draws from."""
    config: str
    """Cascade config of both trainings (``--data`` and ``--fields`` given to it)."""
    processes: int
    """Training processes."""
    later_window: int
    """Window (days) of the later explicit value the rare pairs are judged against."""
    rare_max: int = 2
    """A pair is rare with at most this many impressions in the fitted window."""
    seed: int = 7
    """Generator seed (the log is the same for every training seed)."""
    pipeline_config: str = "pipeline"
    """Cascade config of the deployed ``ctr_preranking`` DAG, trained on the servable fields."""
    ablation_pairs: tuple[str, ...] | None = None
    """Cross pairs ablated one at a time on the first seed (None: every cross pair present)."""
    ml100k_days: int = 56
    """The last days of MovieLens-100k the engine builds a partition for: its training rows
    (0: no ML-100k comparison). Its last 56 days hold ~25,000 ratings."""
    ml100k_config: str = "ml100k"
    """Cascade config of the ML-100k comparison (the networks made for ML-100k)."""

    def __post_init__(self) -> None:
        if not 1 <= self.engine_days < self.log_days:
            raise ValueError("engine_days must be >= 1 and leave earlier days of the log")
        if self.later_window >= self.engine_days:
            raise ValueError("later_window must be shorter than engine_days (a later partition)")


FULL = CrossSetup(
    impressions=400_000,
    log_days=21,
    engine_days=14,
    users=20_000,
    items=5_000,
    config="generated_cross",
    processes=2,
    later_window=7,
)
QUICK = CrossSetup(
    impressions=8_000,
    log_days=4,
    engine_days=2,
    users=300,
    items=100,
    config="debug_cross",
    processes=1,
    later_window=1,
    pipeline_config="debug_cross",  # a smoke run of the path: the pipeline config takes minutes
    ablation_pairs=("user_cat",),
    # A few ML-100k days are too few rows for any network to rank: the smoke run builds its
    # training set only (tests/benchmarks/test_preranking_models.py), not the comparison.
    ml100k_days=0,
)


def cross_pair_of(name: str) -> engine.CrossPair:
    """The engine's two-key pair a cross field belongs to (its name's longest pair prefix)."""
    found = [p for p in engine.CROSSES if name.startswith(f"{p.name}_")]
    if not found:
        known = [p.name for p in engine.CROSSES]
        raise ValueError(
            f"cross field {name!r} names no pair of the engine ({known}); a cross field is "
            "named <pair>_<statistic>"
        )
    return max(found, key=lambda pair: len(pair.name))


def keep_crosses(fields: FieldSet, keep: Callable[[engine.CrossPair], bool]) -> FieldSet:
    """The fields less the ``cross`` ones whose pair ``keep`` rejects (the ids and the user's
    and item's own statistics always stay)."""
    return FieldSet(
        spec for spec in fields if spec.kind != "cross" or keep(cross_pair_of(spec.name))
    )


def without_cross(fields: FieldSet) -> FieldSet:
    """The same fields less the ``cross`` ones (ids and the user's and item's own statistics)."""
    return keep_crosses(fields, lambda pair: False)


def without_cross_same_position(fields: FieldSet) -> FieldSet:
    """The same fields less the ``cross`` ones, position crosses kept (``item_pos_*``)."""
    return keep_crosses(fields, lambda pair: POSITION_KEY in pair.keys)


def servable_crosses(fields: FieldSet) -> FieldSet:
    """The same fields with only the crosses whose every key the server fills."""
    return keep_crosses(fields, lambda pair: set(pair.keys) <= SERVED_KEYS)


def cross_pairs(fields: FieldSet) -> list[str]:
    """The names of the cross pairs the fields hold, in the engine's order."""
    present = {cross_pair_of(spec.name).name for spec in fields if spec.kind == "cross"}
    return [pair.name for pair in engine.CROSSES if pair.name in present]


def ablation_arms(fields: FieldSet, setup: CrossSetup) -> dict[str, FieldSet]:
    """``without_<pair>``: every field less one cross pair's, for each ablated pair."""
    present = cross_pairs(fields)
    chosen = present if setup.ablation_pairs is None else list(setup.ablation_pairs)
    unknown = [name for name in chosen if name not in present]
    if unknown:
        raise ValueError(f"ablation pairs {unknown} hold no cross field here; present: {present}")
    return {
        f"without_{name}": keep_crosses(fields, lambda pair, name=name: pair.name != name)
        for name in chosen
    }


ARMS: dict[str, Callable[[FieldSet], FieldSet] | None] = {
    "with_cross": None,
    "without_cross": without_cross,
    "without_cross_same_position": without_cross_same_position,
    "servable_cross": servable_crosses,
}
"""The field sets each seed trains the cascade on (None: every field)."""


def lifts(aucs: dict[str, float]) -> dict[str, float]:
    """One seed's lifts from its arms' FSCD test AUCs (keys of :data:`ARMS`)."""
    return {
        "cross_lift": aucs["with_cross"] - aucs["without_cross"],
        "cross_lift_same_position": aucs["with_cross"] - aucs["without_cross_same_position"],
        "cross_lift_servable": aucs["servable_cross"] - aucs["without_cross"],
    }


def pipeline_goals(auc_ratio: float, feature_cost_ratio: float) -> bool:
    """Whether a cascade meets the goals the docs state (:data:`GOAL_AUC_RATIO`,
    :data:`GOAL_FEATURE_COST_RATIO`)."""
    return auc_ratio >= GOAL_AUC_RATIO and feature_cost_ratio <= GOAL_FEATURE_COST_RATIO


MEDIANS = (
    "auc_with_cross",
    "auc_without_cross",
    "auc_without_cross_same_position",
    "auc_servable_cross",
    "cross_lift",
    "cross_lift_same_position",
    "cross_lift_servable",
    "pipeline_config_auc_ratio",
    "pipeline_config_feature_cost_ratio",
)
"""Per-seed figures reported as their median over the seeds."""


def generator_config(setup: CrossSetup) -> GeneratorConfig:
    """The generated log's config (the generator's effects at their defaults)."""
    return GeneratorConfig(
        impressions=setup.impressions,
        days=setup.log_days,
        users=setup.users,
        items=setup.items,
        seed=setup.seed,
        partitions=2,
    )


def build_training_set(work: Path, setup: CrossSetup) -> dict[str, Any]:
    """Generate the log and run the engine over its last days (a running Spark session is
    borrowed, else one is started and stopped)."""
    settings = load_settings()
    generator = generator_config(setup)
    with active_or_new(lambda: engine.build_session(settings)) as spark:
        return build_engine_training_set(
            work / "training_set",
            spark=spark,
            generator=generator,
            train_days=setup.engine_days,
            settings=dataclasses.replace(settings, home=work / "home"),
        )


@functools.cache
def _rows_digest(data: str, modified_ns: int) -> str:
    """:func:`frame_digest` of a training set's rows (the file's modification time in the key:
    a rebuilt file is read again)."""
    return frame_digest(pd.read_parquet(data))


def train(
    setup: CrossSetup,
    data: Path,
    fields_file: Path,
    run_dir: Path,
    seed: int,
    config: str | None = None,
    kept: KeptTrainings | None = None,
) -> dict[str, Any]:
    """One cascade (``config``, default the setup's) on the training set with the given fields;
    its ``result.json``. With a keep folder (``kept``), the one kept at this commit for the same
    rows, fields, config and seed is reused (:mod:`benchmarks.kept_trainings`)."""
    kept = kept or KeptTrainings(None)
    inputs = {
        "training": "cross",
        "config": config or setup.config,
        "seed": seed,
        "processes": setup.processes,
        "rows_digest": _rows_digest(str(data), data.stat().st_mtime_ns) if kept.root else None,
        "fields_digest": files_digest([fields_file]),
    }
    return kept.run(
        run_dir, inputs, lambda: _train(setup, data, fields_file, run_dir, seed, config)
    )


def _train(
    setup: CrossSetup,
    data: Path,
    fields_file: Path,
    run_dir: Path,
    seed: int,
    config: str | None,
) -> dict[str, Any]:
    from benchmarks.preranking_models import _read, tracking_settings, trained_models_digest

    settings = tracking_settings(run_dir)
    if settings.tracking_uri.startswith("sqlite:"):
        # Runs side by side creating one SQLite store's tables collide: one store per run.
        private = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        settings = dataclasses.replace(settings, mlflow_tracking_uri=private)
    code, tail = launch_cascade(
        config or setup.config,
        run_dir,
        processes=setup.processes,
        settings=settings,
        extra_args=["--data", str(data), "--fields", str(fields_file), "--seed", str(seed)],
    )
    result = _read(run_dir / "result.json", f"cascade training (exit {code})", tail)
    result["model_digest"] = trained_models_digest(run_dir)
    return result


def train_arms(
    setup: CrossSetup,
    data: Path,
    arms: list[tuple[str, str, Path]],
    work: Path,
    seed: int,
    kept: KeptTrainings | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`train` of each ``(arm, config, fields file)`` on ``data`` with ``seed``, each in
    ``work/<arm>-seed<seed>``: ``{arm: result}``. One-process runs (the smoke path) go two side
    by side: each leaves a core idle otherwise."""
    jobs = [
        (setup, data, path, work / f"{arm}-seed{seed}", seed, config, kept)
        for arm, config, path in arms
    ]
    with ThreadPoolExecutor(max_workers=2 if setup.processes == 1 else 1) as pool:
        results = list(pool.map(lambda job: train(*job), jobs))
    return {arm: result for (arm, _, _), result in zip(arms, results, strict=True)}


def ml100k_log(spark: Any, out: Path) -> Path:
    """MovieLens-100k in the engine's log schema (:func:`jobs.ctr_log_sources.from_ml100k`:
    rating >= 4 a click, segment the age band, category the primary genre; no position, no
    context) written as parquet to ``out``."""
    from jobs.ctr_log_sources import LOG_SCHEMA, from_ml100k

    log, _quarantined = from_ml100k(spark)
    log.select(*[name for name, _ in LOG_SCHEMA]).write.mode("overwrite").parquet(str(out))
    return out


def build_ml100k_training_set(work: Path, days: int) -> dict[str, Any]:
    """MovieLens-100k through the engine over its last ``days`` days, with the pairs it can
    key (:data:`jobs.ctr_cross_config.ML100K_PAIRS`), joined into a training set under
    ``work/training_set`` (a running Spark session is borrowed, else one is started)."""
    settings = load_settings()
    with active_or_new(lambda: engine.build_session(settings)) as spark:
        return build_engine_training_set(
            work / "training_set",
            spark=spark,
            log=ml100k_log(spark, work / "log"),
            train_days=days,
            settings=dataclasses.replace(settings, home=work / "home"),
            pairs=engine.ML100K_PAIRS,
        )


def ml100k_comparison(
    work: Path, seeds: list[int], setup: CrossSetup, kept: KeptTrainings | None = None
) -> dict[str, Any]:
    """FSCD with and without the cross fields on MovieLens-100k
    (:func:`build_ml100k_training_set`), one training per arm and seed
    (``setup.ml100k_config``): the check on data without planted structure. A training that
    fails (too few rows to rank, say) is reported under ``ml100k_failed``, not raised: the
    comparison is one part of a long benchmark."""
    built = build_ml100k_training_set(work, setup.ml100k_days)
    data, fields_file = Path(built["data"]), Path(built["fields_file"])
    without = without_cross(FieldSet.load(fields_file))
    arm_files = {"with_cross": fields_file, "without_cross": without.save(work / "without_cross")}
    facts: dict[str, Any] = {
        "engine_days": built["engine_days"],
        "training_rows": built["rows"],
        "fields": built["fields"],
        "fields_without_cross": len(without),
        "pairs": built["pairs"],
        "config": setup.ml100k_config,
        "seeds": seeds,
        "rows_digest": frame_digest(pd.read_parquet(data)),
    }
    runs = []
    for seed in seeds:
        arms = [(arm, setup.ml100k_config, path) for arm, path in arm_files.items()]
        try:
            results = train_arms(setup, data, arms, work, seed, kept)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0]
            return {"ml100k_cross_lift": None, "ml100k_failed": reason, "ml100k_setup": facts}
        aucs = {arm: float(result["fscd_auc"]) for arm, result in results.items()}
        runs.append(
            {
                "seed": seed,
                "auc_with_cross": aucs["with_cross"],
                "auc_without_cross": aucs["without_cross"],
                "cross_lift": aucs["with_cross"] - aucs["without_cross"],
                "model_digests": {arm: r["model_digest"] for arm, r in results.items()},
            }
        )
    medians = {
        key: float(statistics.median(run[key] for run in runs))
        for key in ("auc_with_cross", "auc_without_cross", "cross_lift")
    }
    digest = digest_of(d for r in runs for d in r["model_digests"].values())
    return {
        **{f"ml100k_{key}": value for key, value in medians.items()},
        "ml100k_setup": {**facts, "per_seed": runs, "model_digest": digest},
    }


def rare_pairs(lake: Path, days: list[str], setup: CrossSetup) -> dict[str, Any]:
    """Learned vs additive on the rare user x genre pairs of the first engine partition,
    against their explicit CTR in the partition ``later_window`` days on."""
    pair, keys = RARE_PAIR
    before, after = days[0], days[setup.later_window]
    parts = published_partitions(
        lake, source="generated", pairs=[engine.PAIRS_BY_NAME[pair]], days=[before, after]
    )[pair]
    return rare_pair_scores(
        parts[before],
        parts[after],
        pair=pair,
        keys=keys,
        fit_window=30,
        later_window=setup.later_window,
        rare_max=setup.rare_max,
    ) | {"fitted_partition": before, "later_partition": after}


def cross_comparison(
    work: Path, seeds: list[int], setup: CrossSetup, kept: KeptTrainings | None = None
) -> dict[str, Any]:
    """The keys of the module docstring (``kept``: the run's keep folder, if any)."""
    built = build_training_set(work, setup)
    data, fields_file = Path(built["data"]), Path(built["fields_file"])
    every = FieldSet.load(fields_file)
    arm_files = {"with_cross": fields_file}
    for arm, subset in ARMS.items():
        if subset is not None:
            arm_files[arm] = subset(every).save(work / arm)
    ablation_sets = ablation_arms(every, setup)
    ablated = {arm: fields.save(work / arm) for arm, fields in ablation_sets.items()}
    cross_names = {spec.name for spec in every if spec.kind == "cross"}
    runs: list[dict[str, Any]] = []
    ablation: dict[str, float] = {}
    ablation_base = float("nan")
    for seed in seeds:
        arms = [(arm, setup.config, path) for arm, path in arm_files.items()]
        arms.append(("pipeline", setup.pipeline_config, arm_files["servable_cross"]))
        if seed == seeds[0]:
            arms += [(arm, setup.config, path) for arm, path in ablated.items()]
        trained = train_arms(setup, data, arms, work, seed, kept)
        with_run, without_run, pipeline = (
            trained["with_cross"],
            trained["without_cross"],
            trained["pipeline"],
        )
        aucs = {arm: float(trained[arm]["fscd_auc"]) for arm in arm_files}
        if seed == seeds[0]:
            ablation = {arm: float(trained[arm]["fscd_auc"]) for arm in ablated}
            ablation_base = aucs["with_cross"]
        runs.append(
            {
                "seed": seed,
                "auc_with_cross": aucs["with_cross"],
                "auc_without_cross": aucs["without_cross"],
                "auc_without_cross_same_position": aucs["without_cross_same_position"],
                "auc_servable_cross": aucs["servable_cross"],
                **lifts(aucs),
                "teacher_auc_with_cross": float(with_run["teacher_auc"]),
                "teacher_auc_without_cross": float(without_run["teacher_auc"]),
                "cost_ratio_with_cross": float(with_run["cost_ratio"]),
                "cross_fields_kept": [f for f in with_run["fscd_fields"] if f in cross_names],
                "fscd_strength_with_cross": with_run.get("fscd_strength"),
                "pipeline_config_auc_ratio": float(pipeline["auc_ratio"]),
                "pipeline_config_feature_cost_ratio": float(pipeline["cost_ratio"]),
                "model_digest_with_cross": with_run["model_digest"],
                "model_digest_without_cross": without_run["model_digest"],
                "model_digests": {arm: run["model_digest"] for arm, run in trained.items()},
            }
        )
    by_lift = sorted(runs, key=lambda run: run["cross_lift"])
    middle = by_lift[(len(by_lift) - 1) // 2]
    with torch_threads(1):  # small full-batch fits: one thread beats many on a busy machine
        rare = rare_pairs(Path(built["lake"]), list(built["engine_days"]), setup)
    frame = pd.read_parquet(data)
    config = get_cascade_config(setup.config)
    medians = {key: float(statistics.median(r[key] for r in runs)) for key in MEDIANS}
    ml100k = ml100k_comparison(work / "ml100k", seeds, setup, kept) if setup.ml100k_days > 0 else {}
    return {
        **medians,
        "cross_lift_by_pair": {
            arm.removeprefix("without_"): ablation_base - auc for arm, auc in ablation.items()
        },
        "cross_ablation": {
            "seed": seeds[0],
            "auc_with_cross": ablation_base,
            "auc_without_pair": {arm.removeprefix("without_"): a for arm, a in ablation.items()},
            "fields_by_arm": {arm: len(fields) for arm, fields in ablation_sets.items()},
            "what": "the first seed's with-cross FSCD test AUC less that of an arm without one "
            "cross pair (its explicit statistics and its learned field)",
        },
        **ml100k,
        "pipeline_config_goal_met": pipeline_goals(
            medians["pipeline_config_auc_ratio"], medians["pipeline_config_feature_cost_ratio"]
        ),
        "cross_fields_kept": middle["cross_fields_kept"],
        "learned_cross_rare_pair_spearman": rare["learned_cross_rare_pair_spearman"],
        "additive_rare_pair_spearman": rare["additive_rare_pair_spearman"],
        "explicit_rare_pair_spearman": rare["explicit_rare_pair_spearman"],
        "blend_rare_pair_spearman": rare["blend_rare_pair_spearman"],
        "cross_rare_pairs": rare,
        "cross_per_seed": runs,
        "cross_setup": {
            **dataclasses.asdict(setup),
            "log_impressions": built["log_impressions"],
            "training_rows": built["rows"],
            "fields": built["fields"],
            "fields_without_cross": len(every) - len(cross_names),
            "fields_by_arm": {arm: len(FieldSet.load(path)) for arm, path in arm_files.items()},
            "served_keys": sorted(SERVED_KEYS),
            "planted": planted(generator_config(setup)),
            "pipeline_config": setup.pipeline_config,
            "pipeline_config_fields": "the servable_cross arm's (ids, own statistics, user_cat)",
            "fields_by_kind": built["fields_by_kind"],
            "pairs": built["pairs"],
            "learned_fields": built["learned"].get("columns", []),
            "engine_days": built["engine_days"],
            "seeds": seeds,
            "fscd_strengths": list(config.fscd_strengths),
            "lambda_sweep": (
                f"{len(config.fscd_strengths)} strengths ({setup.config} config), shorter than "
                f"the generated config's 8: every seed trains the cascade {len(ARMS)} times, "
                "and the pipeline config once"
            ),
            "auc": "test AUC of the FSCD model chosen on validation (cost budget "
            f"{config.cost_budget}), median over the seeds",
        },
        "cross_provenance": {
            "input_digest": code_digest(INPUT_CODE, dataclasses.asdict(setup)),
            "rows_digest": frame_digest(frame),
            "fields_digest": files_digest([fields_file]),
            "model_digest": digest_of(d for r in runs for d in r["model_digests"].values()),
        },
    }
