"""One benchmark before and after a change, interleaved: does the change leave its figures alone?

    cascade bench before-after --out FILE --bench compile --model preranking --before main
    cascade bench before-after --out FILE --bench serving --seconds 30 --before main --after .

Each side runs from its own checkout: a revision (``--before``, ``--after``; default ``.``)
becomes a detached ``git worktree`` in a temporary folder, removed at the end, and ``.`` is
this working tree as it is. The sides alternate, the first one rotating each round (A B, B A,
A B, ...), each run a fresh ``cascade bench`` process whose ``PYTHONPATH`` is the side's
checkout (its packages shadow the installed ones), with the same benchmark options
(``--quick``, ``--model``, ``--seconds``, ... as ``cascade bench`` takes them).

The result holds every run's JSON and, for each number the benchmark reported in every run
(``figures``: its dotted path -> ``before`` and ``after`` medians over the rounds, the change
and each side's range), whether the change is within noise: the medians differ by no more than
the wider of the two sides' ranges. ``moved`` lists the figures that are not, so the verdict is
one line to read. Provenance (machine, commit, digests), raw ``*_runs`` lists and their
``spread`` summaries are left out of the comparison. Needs ``--rounds`` >= 2: one run a side
has no range to judge a difference by.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.commands import BENCH_OPTIONS
from benchmarks.provenance import REPO_ROOT, RUNS_SUFFIX, rotated

WORKING_TREE = "."
NOT_COMPARED = frozenset(
    {
        "machine", "git_commit", "git_dirty", "input_digest", "inputs", "input_files_digest",
        "model_digest", "model_provenance", "repeats", "spread", "quick",
        "load_average_before", "load_average_after",
    }
)  # fmt: skip
"""Top-level keys of a result that describe the run, not what it measured."""


def figures(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number of a benchmark result by dotted path (list items by index), without the
    run's description (:data:`NOT_COMPARED`) and raw ``*_runs`` lists."""
    found: dict[str, float] = {}
    items: Any = result.items() if isinstance(result, Mapping) else enumerate(result)
    for key, value in items:
        if not prefix and key in NOT_COMPARED or str(key).endswith(RUNS_SUFFIX):
            continue
        path = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            found[path] = float(value)
        elif isinstance(value, Mapping | list):
            found.update(figures(value, f"{path}."))
    return found


def compare(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> dict:
    """``{"figures": {path: ...}, "moved": [path, ...]}`` over the figures every run of both
    sides reported (see the module's docstring)."""
    if len(before) < 2 or len(after) < 2:
        raise ValueError("comparing needs at least two runs a side (--rounds 2)")
    runs = [figures(r) for r in (*before, *after)]
    shared = sorted(set.intersection(*(set(r) for r in runs)))
    compared: dict[str, dict[str, float | bool | None]] = {}
    for path in shared:
        old = [r[path] for r in runs[: len(before)]]
        new = [r[path] for r in runs[len(before) :]]
        old_median, new_median = statistics.median(old), statistics.median(new)
        noise = max(max(old) - min(old), max(new) - min(new))
        compared[path] = {
            "before": old_median,
            "after": new_median,
            "change": None if old_median == 0 else new_median / old_median - 1,
            "before_range": max(old) - min(old),
            "after_range": max(new) - min(new),
            "within_noise": abs(new_median - old_median) <= noise,
        }
    return {
        "figures": compared,
        "moved": [path for path, row in compared.items() if not row["within_noise"]],
    }


@contextlib.contextmanager
def checkout(revision: str, scratch: Path) -> Iterator[Path]:
    """The folder to run ``revision`` from: this working tree for ``.``, else a detached
    worktree of it under ``scratch``, removed afterwards."""
    if revision == WORKING_TREE:
        yield REPO_ROOT
        return
    folder = scratch / f"tree-{len(list(scratch.iterdir()))}"
    git = ["git", "-C", str(REPO_ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(folder), revision], check=True)
    try:
        yield folder
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(folder)], check=False)


def run_side(tree: Path, bench: str, options: Sequence[str], out: Path) -> dict[str, Any]:
    """One ``cascade bench`` run of ``tree``'s code; its result."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [
        sys.executable, "-c", "import sys; from cascade.cli import main; sys.exit(main())",
        "bench", bench, "--out", str(out), *options,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`cascade bench {bench}` from {tree} exited {done.returncode}")
    return dict(json.loads(out.read_text()))


def bench_options(args: argparse.Namespace) -> list[str]:
    """The options given for the benchmark itself, as ``cascade bench`` takes them."""
    options = ["--quick"] if args.quick else []
    for name in BENCH_OPTIONS:
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            options += [f"--{name}", str(value)]
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bench", required=True, help="the benchmark (cascade bench NAME)")
    parser.add_argument("--before", required=True, help="revision before the change")
    parser.add_argument("--after", default=WORKING_TREE, help="revision after ('.': this tree)")
    parser.add_argument("--rounds", type=int, default=3, help="runs a side (at least 2)")
    parser.add_argument("--quick", action="store_true")
    for name, help_ in BENCH_OPTIONS.items():
        parser.add_argument(f"--{name}", help=help_)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: one run a side has no range to judge by")
    options = bench_options(args)
    sides = {"before": args.before, "after": args.after}
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="cascade-before-after-") as tmp:
        scratch = Path(tmp)
        with checkout(args.before, scratch) as old, checkout(args.after, scratch) as new:
            trees = {"before": old, "after": new}
            for round_ in range(args.rounds):
                for side in rotated(list(sides), round_):
                    out = scratch / f"{side}-{round_}.json"
                    print(f"[before-after] round {round_ + 1}/{args.rounds}: {side}", flush=True)
                    results[side].append(run_side(trees[side], args.bench, options, out))
    report = {
        "bench": args.bench,
        "options": options,
        "revisions": sides,
        "rounds": args.rounds,
        **compare(results["before"], results["after"]),
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    moved = report["moved"]
    print(f"[before-after] {len(report['figures'])} figures, {len(moved)} beyond noise: {moved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
