"""The ``cascade bench`` command: run one benchmark of :mod:`benchmarks.registry`, write its JSON.

    cascade bench NAME --out FILE [--quick] [--OPTION VALUE ...]
    cascade bench gpu-check --out FILE [its own options]   (and the other SCRIPTS)

Registered under the ``cascade.commands`` entry point (``pyproject.toml``), so the kernel's CLI
offers it without importing this package.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.stopping import Stopped, stop_on_signals
from cascade.errors import UsageError

STOP_GRACE_S = 180.0
"""How long a stopped script benchmark may take to stop its own stack before it is killed."""

BENCH_OPTIONS = {
    "impressions": "impressions, comma-separated sizes (ctr-features)",
    "repeats": "timed repeats behind each figure, variants alternating (every benchmark)",
    "config": "named training config (preranking, multimodal, serving)",
    "seeds": "training seeds, comma-separated: one run each, medians reported (preranking)",
    "keep": "folder keeping each training: a run cut short resumes from those it finished, at "
    "the same commit from a clean tree (preranking)",
    "corpus": "corpus folder to train on instead of generated pairs (multimodal)",
    "model": "model to compile: preranking (compile); an asr_model.pt folder to evaluate (asr)",
    "model-dir": "trained ASR model folder that --model asr compiles (compile)",
    "sizes": "corpus sizes in utterances, comma-separated (asr)",
    "events": "events to publish (events)",
    "partitions": "partitions a burst's events name, one run each (events)",
    "candidates": "item ids per request (serving)",
    "clients": "concurrent clients (serving)",
    "seconds": "measured seconds of load, after the warm-up (serving)",
    "workers": "server processes (serving)",
    "cross-features": "1 (default) or 0: the served model reads cross statistics from the "
    "online store per request (serving; --no-cross-features is 0)",
    "rate": "open-loop arrival rate, requests/s (serving; default 70%% of the closed loop's)",
    "pairs": "generated image-text pairs, comma-separated sizes (multimodal-corpus)",
}


SCRIPTS = {
    "gpu-check": "benchmarks.gpu_check",
    "online-sqlite": "benchmarks.online_sqlite",
    "online-materialize": "benchmarks.online_materialize",
    "feedback-writer": "benchmarks.feedback_writer",
    "before-after": "benchmarks.before_after",
}
"""Benchmarks that are their own program (their options are their own; they write ``--out``)."""


def script_command(args: argparse.Namespace) -> list[str]:
    """The process that runs script benchmark ``args.name`` with every option given."""
    command = [sys.executable, "-m", SCRIPTS[args.name], "--out", str(args.out)]
    if args.quick:
        command.append("--quick")
    for name in BENCH_OPTIONS:
        if getattr(args, name) is not None:
            command += [f"--{name}", str(getattr(args, name))]
    return command + list(getattr(args, "forwarded", ()))


def run_script(command: list[str], what: str) -> int:
    """Run a script benchmark; a stop signal is passed on to it (it stops its own stack) and
    waited for, rather than the script being killed outright."""
    import subprocess

    process = subprocess.Popen(command)
    with stop_on_signals(what):
        try:
            return process.wait()
        except Stopped as stopped:
            process.send_signal(stopped.signum)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return stopped.exit_code


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.registry import run_benchmark

    what = f"bench {args.name}"
    if args.name in SCRIPTS:
        return run_script(script_command(args), what)
    forwarded = getattr(args, "forwarded", ())  # set by the CLI's main
    if forwarded:
        raise UsageError(
            f"benchmark {args.name!r} takes no {' '.join(forwarded)}; "
            f"`cascade bench {args.name} --help` lists its options"
        )
    options = {name: getattr(args, name) for name in BENCH_OPTIONS}
    try:
        # SIGTERM / SIGHUP / a time limit unwind like Ctrl-C: a private stack is stopped.
        with stop_on_signals(what):
            result = run_benchmark(args.name, args.out, quick=args.quick, options=options)
    except Stopped as stopped:
        print(f"cascade {what}: {stopped}; no result written", file=sys.stderr)
        return stopped.exit_code
    print(json.dumps(result, indent=2, default=str))
    print(f"written to {args.out}", file=sys.stderr)  # stdout stays one JSON document
    return 0


def register(sub: Any) -> tuple[type[BaseException], ...]:
    """Add ``bench``; returns the errors the CLI reports as one line (the stack's, whose private
    stack the event and serving benchmarks start)."""
    from infra.services import StackError

    bench = sub.add_parser("bench", help="run a benchmark, write JSON results")
    from benchmarks.registry import ALIASES, BENCHMARKS

    # The issues' names (ctr-features, compile) are accepted too.
    bench.add_argument(
        "name",
        choices=(*BENCHMARKS, *ALIASES, *SCRIPTS),
        help="the benchmark to run (or its alias); "
        f"{', '.join(SCRIPTS)} take their own options too",
    )
    bench.add_argument("--out", type=Path, required=True, help="JSON file to write")
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    for option, text in BENCH_OPTIONS.items():
        bench.add_argument(f"--{option}", dest=option, help=text)
    bench.add_argument(
        "--no-cross-features",
        dest="cross-features",
        action="store_const",
        const="0",
        help="serve the model without cross features (serving; same as --cross-features 0)",
    )
    bench.set_defaults(func=cmd_bench, forwards=True)
    return (StackError,)
