"""DeepSpeed ZeRO-2 training of the image-text transformer (dense or MoE), expert-parallel over
the processes, with MLflow logging, resumable checkpoints and retrieval evaluation.

    cascade multimodal train --config debug --out OUT [--corpus CORPUS]   # 2 processes

starts ``--processes`` (default: the settings' ``train_processes``, 2) workers under
``torch.distributed.run`` (gloo on CPU, NCCL on GPU); the same module is the worker::

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 \\
        -m models.multimodal.train --config debug --out OUT

Without ``--corpus`` it trains on generated pairs (:mod:`models.multimodal.pairs`); with one, on
the corpus job's parquet shards. From Python (the DAG's step) call :func:`train_multimodal`.

Each MoE layer's experts are spread over the processes (``ep_size`` = world size when it
divides the experts of a prototype group, else 1); the optimizer gets DeepSpeed's MoE parameter
groups so expert gradients are reduced over the expert-data-parallel group only. Every
``checkpoint_every`` steps all ranks save a DeepSpeed checkpoint under ``OUT/checkpoints``;
started again with the same ``--out``, config and data, a run resumes there (batches are
functions of (seed, step, rank)). Rank 0 logs to the MLflow experiment ``multimodal``: the
loss and its parts, per MoE layer the coefficient of variation of tokens per expert
(``expert_load_cv.layerN``) and the share of routed tokens dropped for capacity
(``tokens_dropped.layerN``); at the end image->text and text->image recall@1/5 on the test
split, and on generated pairs also on the ``heldout`` split of caption templates no training
pair has (``heldout_templates_*``, :data:`models.multimodal.pairs.HELDOUT_TEMPLATES`).
``OUT/result.json`` holds the headline figures; ``OUT/model`` the final DeepSpeed checkpoint
(experts in their own files), with the model's config, its corpus's caption tokenizer and their
digests beside the module states (:mod:`models.multimodal.stored`).

``--throughput-steps N`` instead times N training steps of this config and of its dense twin,
interleaved in the same processes, ``--throughput-repeats`` rounds (:func:`measure_throughput`,
used by the benchmark).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from cascade.config import Settings, load_settings
from cascade.progress import Progress
from cascade.results import write_result
from cascade.training.checkpoints import (
    CHECKPOINTS,
    fingerprint,
    keep_only_run,
    resume_step,
    save_latest_checkpoint,
)
from cascade.training.crash_points import crash_if_due, crash_point
from cascade.training.curves import CURVES_DIR, CurveLog
from cascade.training.deepspeed_config import deepspeed_config as build_deepspeed_config
from cascade.training.deepspeed_config import warmup_decay_scheduler
from cascade.training.launch import (
    all_reduced,
    init_distributed,
    launch_for_result,
    rank_world,
)
from cascade.training.resumable_run import RUN_MARKER, failed_on_error, open_resumable_run
from models.multimodal.config_registry import CONFIGS, MultimodalTrainConfig, get_config
from models.multimodal.model import ImageTextTransformer, objective, parameter_counts
from models.multimodal.pairs import (
    HELDOUT,
    Pairs,
    corpus_files,
    corpus_vocab_size,
    generate_pairs,
    load_split,
)
from models.multimodal.stored import save_model_files

EXPERIMENT = "multimodal"
RESULT_KEYS = ("run_id", "config", "i2t_recall_at_1", "t2i_recall_at_1", "final_loss")
"""Keys every complete ``result.json`` carries."""
THROUGHPUT_REPEATS = 5
"""Timed runs of each model in :func:`measure_throughput`; the reported figure is the median."""


def expert_parallel_size(config: MultimodalTrainConfig, world: int) -> int:
    """All processes share each layer's experts when they divide them evenly; else each holds
    all of them (plain data parallelism)."""
    if config.model.moe is None or config.model.moe.experts_per_group % world:
        return 1
    return world


def deepspeed_config(config: MultimodalTrainConfig) -> dict[str, Any]:
    """Adam with linear warm-up then decay (the scheduler is kept in the checkpoint), ZeRO
    ``config.zero_stage``, the config's clipping."""
    return build_deepspeed_config(
        micro_batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=config.weight_decay,
        zero_stage=config.zero_stage,
        gradient_clipping=config.gradient_clipping,
        scheduler=warmup_decay_scheduler(
            lr=config.lr, steps=config.steps, warmup_steps=config.warmup_steps
        ),
        throughput_timer=False,
    )


def build_model(config: MultimodalTrainConfig, world: int) -> ImageTextTransformer:
    torch.manual_seed(config.seed)
    model_config = dataclasses.replace(config.model, ep_size=expert_parallel_size(config, world))
    return ImageTextTransformer(model_config)


def make_engine(model: ImageTextTransformer, config: MultimodalTrainConfig) -> Any:
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "name": "params"}]
    if model.moe_layers():
        # Expert parameters get their own groups: their gradients are averaged over the
        # expert-data-parallel group, not the whole world.
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=groups, config=deepspeed_config(config)
    )
    return engine


@dataclasses.dataclass
class Data:
    train: Pairs
    test: Pairs
    source: str
    heldout: Pairs | None = None
    """Generated pairs of templates no training pair has (None for a corpus)."""


def for_corpus(config: MultimodalTrainConfig, corpus: Path | None) -> MultimodalTrainConfig:
    """The config with its vocabulary widened to the corpus tokenizer's, when that is larger."""
    vocab = None if corpus is None else corpus_vocab_size(corpus)
    if vocab is None or vocab <= config.model.vocab_size:
        return config
    return dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=vocab))


def load_data(config: MultimodalTrainConfig, corpus: Path | None) -> Data:
    model = config.model
    if corpus is None:
        args = {"max_tokens": model.max_tokens, "seed": config.seed}
        train = generate_pairs(config.generated_pairs, "train", **args)
        test = generate_pairs(config.generated_pairs, "test", **args)
        heldout = _head(generate_pairs(config.generated_pairs, HELDOUT, **args), config.eval_pairs)
        source = f"generator:{config.generated_pairs}"
    else:
        args = {"max_tokens": model.max_tokens, "vocab_size": model.vocab_size}
        train = load_split(corpus, "train", limit=config.max_train_pairs, **args)
        test = load_split(corpus, "test", limit=config.eval_pairs, **args)
        heldout = None
        source = str(corpus)
    if config.max_train_pairs is not None and corpus is None:
        train = _head(train, config.max_train_pairs)
    return Data(train, _head(test, config.eval_pairs), source, heldout)


def _head(pairs: Pairs, n: int) -> Pairs:
    return Pairs(pairs.pair_ids[:n], pairs.images[:n], pairs.tokens[:n], pairs.captions[:n])


def step_batch(
    n: int, config: MultimodalTrainConfig, step: int, rank: int, world: int
) -> np.ndarray:
    """Indices of this rank's batch at ``step``: a function of (seed, epoch, step, rank)."""
    per_step = config.batch_size * world
    steps_per_epoch = n // per_step
    if steps_per_epoch < 1:
        raise ValueError(
            f"{n} training pairs are too few for {world} processes x batch {config.batch_size}"
        )
    epoch, within = divmod(step, steps_per_epoch)
    order = np.random.default_rng([config.seed, epoch]).permutation(n)
    start = within * per_step + rank * config.batch_size
    return order[start : start + config.batch_size]


class RoutingWindow:
    """Tokens per expert and dropped tokens of every MoE layer, summed over a logging window."""

    def __init__(self, model: ImageTextTransformer) -> None:
        self.layers = model.moe_layers()
        self.reset()

    def reset(self) -> None:
        self.counts = [torch.zeros(0) for _ in self.layers]
        self.dropped = torch.zeros(len(self.layers), dtype=torch.float64)
        self.routed = torch.zeros(len(self.layers), dtype=torch.float64)

    def add(self) -> None:
        for i, layer in enumerate(self.layers):
            stats = layer.stats
            assert stats is not None
            counts = stats.counts.double()
            self.counts[i] = counts if self.counts[i].numel() == 0 else self.counts[i] + counts
            self.dropped[i] += stats.dropped
            self.routed[i] += stats.routed

    def summary(self, world: int) -> dict[str, float]:
        """Per layer, over all ranks: load CV (mean over prototype groups) and dropped share."""
        if not self.layers:
            return {}
        flat = all_reduced(
            torch.cat([c.flatten() for c in self.counts] + [self.dropped, self.routed])
        )
        values: dict[str, float] = {}
        offset = 0
        for i, counts in enumerate(self.counts):
            c = flat[offset : offset + counts.numel()].view_as(counts)
            offset += counts.numel()
            cv = c.std(dim=1, unbiased=False) / c.mean(dim=1).clamp(min=1e-9)
            values[f"expert_load_cv.layer{i}"] = float(cv.mean())
        dropped, routed = (
            flat[offset : offset + len(self.layers)],
            flat[offset + len(self.layers) :],
        )
        for i in range(len(self.layers)):
            values[f"tokens_dropped.layer{i}"] = float(dropped[i] / routed[i].clamp(min=1))
        values["expert_load_cv"] = float(
            np.mean([values[f"expert_load_cv.layer{i}"] for i in range(len(self.layers))])
        )
        values["tokens_dropped"] = float(dropped.sum() / routed.sum().clamp(min=1))
        self.reset()
        return values


def run_steps(
    engine: Any,
    data: Pairs,
    config: MultimodalTrainConfig,
    *,
    start_step: int,
    stop_step: int,
    checkpoint: Callable[[int], None] | None = None,
    log: Callable[[int, dict[str, float]], None] | None = None,
) -> int:
    """Optimizer steps ``start_step .. stop_step``; logs every ``log_every`` steps."""
    rank, world = rank_world()
    module = cast(ImageTextTransformer, engine.module)
    routing = RoutingWindow(module)
    crash = crash_point()
    window: list[list[float]] = []
    step = start_step
    progress = Progress(stop_step - step, desc="multimodal train", unit="step", enabled=rank == 0)
    while step < stop_step:
        index = torch.from_numpy(step_batch(len(data), config, step, rank, world))
        torch.manual_seed(config.seed * 1_000_003 + step * world + rank)  # gate noise, dropout
        tokens = data.tokens[index].to(engine.device)
        out = engine(data.images[index].to(engine.device), tokens)
        loss, parts = objective(module, out, tokens)
        engine.backward(loss)
        engine.step()
        routing.add()
        step += 1
        progress.update()
        window.append([float(loss.detach()), *parts.values()])
        if log is not None and (step % config.log_every == 0 or step == stop_step):
            values = all_reduced(torch.tensor(np.mean(window, axis=0), dtype=torch.float64)) / world
            log(
                step,
                dict(zip(("loss", *parts), values.tolist(), strict=True)) | routing.summary(world),
            )
            window = []
        if checkpoint is not None and step % config.checkpoint_every == 0 and step < stop_step:
            checkpoint(step)
        crash_if_due(crash, "train", step, rank=rank, who="multimodal")
    progress.close()
    return step


# --- the run ------------------------------------------------------------------------------


def run_fingerprint(config: MultimodalTrainConfig, corpus: Path | None, world: int) -> str:
    """What checkpoints must match to be resumed: config, data and world size (the expert
    layout of a checkpoint depends on it)."""
    files = (
        []
        if corpus is None
        else [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in corpus_files(corpus)]
    )
    return fingerprint([config.to_dict(), str(corpus), files, world], sort_keys=True)


def _mlflow_run(settings: Settings, out: Path, config: MultimodalTrainConfig, source: str) -> str:
    """Start the run, or reopen the one an interrupted attempt recorded in ``OUT/RUN_MARKER``."""
    params = config.flat_params() | {"data": source}
    path = Path(source)
    return open_resumable_run(
        settings,
        EXPERIMENT,
        out / RUN_MARKER,
        f"multimodal-{config.name}",
        params,
        inputs={f"{path.parent.name}/{path.name}": path},
    )


def train(
    config: MultimodalTrainConfig, *, corpus: Path | None, out: Path
) -> dict[str, Any] | None:
    """The whole run inside an initialized process group; the result on rank 0."""
    import mlflow

    from models.multimodal.evaluate import retrieval_metrics

    started = time.monotonic()
    rank, world = rank_world()
    out = Path(out)
    config = for_corpus(config, corpus)
    data = load_data(config, corpus)
    if len(data.test) < 2:
        raise ValueError(f"{data.source} has {len(data.test)} test pairs; retrieval needs >= 2")
    if rank == 0 and keep_only_run(
        out, run_fingerprint(config, corpus, world), (CHECKPOINTS, RUN_MARKER, CURVES_DIR)
    ):
        print(f"[multimodal] removed checkpoints of another run from {out}", flush=True)
    dist.barrier()
    model = build_model(config, world)
    counts = parameter_counts(model)
    engine = make_engine(model, config)
    ckpt_dir = out / CHECKPOINTS
    run_id = None
    settings = load_settings()
    if rank == 0:  # first: a resume trusts only the checkpoint digests this run recorded
        run_id = _mlflow_run(settings, out, config, data.source)
    start = resume_step(engine, ckpt_dir)
    if start and rank == 0:
        print(f"[multimodal] resumed at step {start} from {ckpt_dir}", flush=True)
    if rank == 0:
        print(
            f"[multimodal] config={config.name} world={world} ep_size={model.config.ep_size} "
            f"train={len(data.train)} test={len(data.test)} pairs from {data.source} "
            f"params total={counts['total']} active={counts['active']} zero={config.zero_stage} "
            f"mlflow={settings.tracking_uri} run={run_id} pid={os.getpid()}",
            flush=True,
        )
    clock = {"t": time.monotonic()}
    losses: list[float] = []
    routing_last: dict[str, float] = {}
    curves = CurveLog(out)

    def log(step: int, values: dict[str, float]) -> None:
        losses.append(values["loss"])
        routing_last.update({k: v for k, v in values.items() if k.startswith(("expert", "tokens"))})
        if rank != 0:
            return
        now = time.monotonic()
        rate = config.log_every / max(now - clock["t"], 1e-9)
        clock["t"] = now
        shown = {k: v for k, v in values.items() if ".layer" not in k}
        text = " ".join(f"{k}={v:.4f}" for k, v in shown.items())
        print(f"[multimodal] step={step}/{config.steps} {text} {rate:.2f} steps/s", flush=True)
        mlflow.log_metrics(values, step=step)
        curves.add(step, shown)

    def checkpoint(step: int) -> None:
        save_latest_checkpoint(engine, ckpt_dir, step)
        if rank == 0:
            print(f"[multimodal] checkpoint step={step} {ckpt_dir}", flush=True)

    with failed_on_error(rank):
        engine.train()
        train_started = time.monotonic()
        run_steps(
            engine, data.train, config, start_step=start, stop_step=config.steps,
            checkpoint=checkpoint, log=log,
        )  # fmt: skip
        train_seconds = time.monotonic() - train_started
        # Every rank runs the evaluation: under expert parallelism each holds part of the experts.
        metrics = retrieval_metrics(cast(ImageTextTransformer, engine.module), data.test)
        if data.heldout is not None and len(data.heldout) >= 2:
            # Captions of templates (colour + shape) that no training pair has.
            unseen = retrieval_metrics(cast(ImageTextTransformer, engine.module), data.heldout)
            metrics |= {f"heldout_templates_{k}": v for k, v in unseen.items()}
        engine.save_checkpoint(str(out / "model"), tag="final", client_state={"step": config.steps})
        dist.barrier()
        result = None
        if rank == 0:
            assert run_id is not None
            tokens_per_step = (
                config.batch_size * world * (model.config.patches + 2 * model.config.max_tokens)
            )
            steps_run = config.steps - start
            result = {
                **metrics,
                "run_id": run_id,
                "config": config.name,
                "moe": config.is_moe,
                "data": data.source,
                "world_size": world,
                "ep_size": model.config.ep_size,
                "active_params": counts["active"],
                "total_params": counts["total"],
                "router_params": counts["router"],
                "final_loss": losses[-1],
                "first_logged_loss": losses[0],
                "train_seconds": train_seconds,
                "steps_run": steps_run,
                "steps_per_s": steps_run / max(train_seconds, 1e-9),
                "train_flops": 6.0 * counts["active"] * tokens_per_step * config.steps,
                "resumed_from_step": start,
                "model_checkpoint": str(out / "model"),
                **routing_last,
            }
            mlflow.log_metrics(
                {
                    k: float(v)
                    for k, v in result.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                }
            )
            save_model_files(out / "model" / "final", model.config, corpus)
            write_result(out / "result.json", result)
            mlflow.log_artifact(str(out / "result.json"))
            mlflow.end_run()
            shutil.rmtree(ckpt_dir, ignore_errors=True)  # finished: nothing to resume
            (out / RUN_MARKER).unlink(missing_ok=True)
            print(
                f"[multimodal] done: loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                f"i2t R@1 {metrics['i2t_recall_at_1']:.3f} R@5 {metrics['i2t_recall_at_5']:.3f} "
                f"t2i R@1 {metrics['t2i_recall_at_1']:.3f} R@5 {metrics['t2i_recall_at_5']:.3f} "
                f"seconds={time.monotonic() - started:.0f} result={out / 'result.json'}",
                flush=True,
            )
    return result


def measure_throughput(
    config: MultimodalTrainConfig, out: Path, steps: int, repeats: int = THROUGHPUT_REPEATS
) -> dict[str, Any]:
    """Training steps/s of ``config`` (MoE) and its dense twin, same batches, in these
    processes: one warm-up run each, then ``repeats`` interleaved timed runs of ``steps`` steps
    (the order rotating each round: ``order`` names who ran first), so background load hits
    both alike. Writes ``OUT/throughput.json``."""
    from models.multimodal.config_registry import dense_twin

    rank, world = rank_world()
    data = load_data(config, None).train
    runs: dict[str, Callable[[], float]] = {}
    for name, variant in (("moe", config), ("dense", dense_twin(config))):
        engine = make_engine(build_model(variant, world), variant)
        engine.train()

        def run(engine: Any = engine, variant: MultimodalTrainConfig = variant) -> float:
            began = time.perf_counter()
            run_steps(engine, data, variant, start_step=0, stop_step=steps)
            if world > 1:
                dist.barrier()
            return time.perf_counter() - began

        runs[name] = run
    for timed in runs.values():
        timed()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    order: list[str] = []
    for round_ in range(repeats):
        names = list(runs)
        # The order rotates each round, so neither model always runs first.
        rotation = names[round_ % len(names) :] + names[: round_ % len(names)]
        order.append(rotation[0])
        for name in rotation:
            times[name].append(runs[name]())
    median = {name: float(np.median(t)) for name, t in times.items()}
    result = {
        "config": config.name,
        "world_size": world,
        "steps": steps,
        "repeats": repeats,
        "order": order,
        "batch_size": config.batch_size,
        "moe_steps_per_s": steps / median["moe"],
        "dense_steps_per_s": steps / median["dense"],
        "moe_vs_dense_throughput": median["dense"] / median["moe"],
        "seconds": times,
    }
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_result(out / "throughput.json", result)
        print(f"[multimodal] throughput {json.dumps(result)}", flush=True)
    return result


# --- launching ----------------------------------------------------------------------------


def train_multimodal(
    settings: Settings | None,
    config_name: str,
    corpus_dir: Path | None,
    out_dir: Path,
    *,
    processes: int | None = None,
    echo: bool = True,
) -> dict[str, Any]:
    """Train ``config_name`` on ``corpus_dir`` (None: generated pairs) with ``processes``
    (default ``settings.train_processes``) DeepSpeed processes; returns ``OUT/result.json``:
    recall@1/5 both ways on the test split, the final loss, expert load and dropped tokens,
    parameter counts and training FLOPs, the MLflow run id.

    A run killed half-way resumes from its checkpoints when called again with the same
    ``out_dir``.
    """
    config = get_config(config_name)  # fail fast on a bad name, before starting processes
    settings = settings or load_settings()
    args = ["--config", config.name, "--out", str(Path(out_dir).resolve())]
    if corpus_dir is not None:
        corpus_dir = Path(corpus_dir).resolve()
        corpus_files(corpus_dir)  # a clear error now rather than in every worker
        args += ["--corpus", str(corpus_dir)]
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    return launch_for_result(
        "models.multimodal.train",
        args,
        what=f"multimodal training {config.name!r}",
        out_dir=out_dir,
        keys=RESULT_KEYS,
        processes=processes or settings.train_processes,
        settings=settings,
        echo=echo,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, choices=sorted(CONFIGS))
    parser.add_argument(
        "--corpus", type=Path, default=None, help="corpus folder (default: generator)"
    )
    parser.add_argument("--out", required=True, type=Path, help="run folder (resumes if present)")
    parser.add_argument("--processes", type=int, default=None, help="workers (default: settings)")
    parser.add_argument(
        "--throughput-steps", type=int, default=None,
        help="time this many steps of the config and its dense twin instead of training",
    )  # fmt: skip
    parser.add_argument(
        "--throughput-repeats", type=int, default=THROUGHPUT_REPEATS,
        help="timed runs of each model with --throughput-steps (median reported)",
    )  # fmt: skip
    # The deepspeed launcher passes --local_rank; torch.distributed.run sets LOCAL_RANK.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    if "RANK" not in os.environ:
        result = train_multimodal(
            None, args.config, args.corpus, args.out, processes=args.processes
        )
        print(
            json.dumps(
                {k: result[k] for k in (*RESULT_KEYS, "i2t_recall_at_5", "t2i_recall_at_5")},
                indent=2,
            )
        )
        return 0
    torch.set_num_threads(1)
    init_distributed()
    if args.throughput_steps:
        measure_throughput(
            get_config(args.config), args.out, args.throughput_steps, args.throughput_repeats
        )
    else:
        train(get_config(args.config), corpus=args.corpus, out=args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
