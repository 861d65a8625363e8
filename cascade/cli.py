"""The ``cascade`` command.

cascade up | down | status
cascade demo [--ds YYYY-MM-DD]
cascade events publish cascade.data.landed --dataset ml100k --partition 2026-11-22
cascade events dead-letters
cascade rollback [--reason TEXT]
cascade step NAME --ds YYYY-MM-DD [--pipeline asr|multimodal|ctr_cross]
cascade score --user 1 --items 10 20 30
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from cascade.config import load_settings


def _print_status(settings: Any) -> None:
    from infra.stack import airflow_password, status

    print(f"profile {settings.profile}, state folder {settings.home}")
    for s in status(settings):
        mark = "up" if s.healthy else ("starting/unhealthy" if s.up else "down")
        pid = f"pid {s.pid}" if s.pid else "-"
        print(f"  {s.name:<8} {mark:<18} {s.url:<32} {pid:<12} log {s.log}")
    password = airflow_password(settings)
    if password:
        print(f"Airflow UI {settings.airflow_url}  user admin  password {password}")


def cmd_up(args: argparse.Namespace) -> int:
    from infra.stack import up

    settings = load_settings()
    up(settings)
    _print_status(settings)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from infra.stack import down

    stopped = down(load_settings())
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _print_status(load_settings())
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from cascade.events import make_event, publish

    payload: dict[str, Any] = json.loads(args.payload) if args.payload else {}
    if args.dataset:
        payload["dataset"] = args.dataset
    if args.partition:
        payload["partition"] = args.partition
    event = make_event(args.type, payload)
    print(json.dumps(publish(event)))
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    from cascade.steps import run_step

    print(json.dumps(run_step(args.name, args.ds, args.pipeline), indent=2, default=str))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from serving.deploy import score

    print(json.dumps(score(args.user, args.items), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cascade.demo import run_demo

    summary = run_demo(ds=args.ds, timeout_s=args.timeout)
    return 0 if summary["dag_run_state"] == "success" else 1


def cmd_rollback(args: argparse.Namespace) -> int:
    from cascade.deployments import rollback

    print(json.dumps(rollback(reason=args.reason), indent=2))
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from cascade.events import dead_letter_summary

    print(json.dumps(dead_letter_summary(), indent=2))
    return 0


BENCH_OPTIONS = {
    "impressions": "impressions, comma-separated sizes (ctr-features)",
    "config": "named training config (preranking, multimodal)",
    "seeds": "training seeds, comma-separated: one run each, medians reported (preranking)",
    "corpus": "corpus folder to train on instead of generated pairs (multimodal)",
    "model": "model to compile: preranking (compile); an asr_model.pt folder to evaluate (asr)",
    "sizes": "corpus sizes in utterances, comma-separated (asr)",
    "events": "events to publish (events)",
    "candidates": "item ids per request (serving)",
    "clients": "concurrent clients (serving)",
    "seconds": "measured seconds of load, after the warm-up (serving)",
    "workers": "server processes (serving)",
    "pairs": "generated image-text pairs, comma-separated sizes (multimodal-corpus)",
}


def cmd_bench(args: argparse.Namespace) -> int:
    from cascade.bench import run_benchmark

    options = {name: getattr(args, name) for name in BENCH_OPTIONS}
    result = run_benchmark(args.name, args.out, quick=args.quick, options=options)
    print(json.dumps(result, indent=2, default=str))
    print(f"written to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from cascade.steps import PIPELINES

    parser = argparse.ArgumentParser(
        prog="cascade", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start the local stack and wait until healthy").set_defaults(
        func=cmd_up
    )
    sub.add_parser("down", help="stop what `cascade up` started").set_defaults(func=cmd_down)
    sub.add_parser("status", help="each service: up/down, URL, pid").set_defaults(func=cmd_status)

    demo = sub.add_parser("demo", help="start the stack and run the pre-ranking path end to end")
    demo.add_argument(
        "--ds", default=dt.datetime.now(dt.UTC).date().isoformat(), help="partition date"
    )
    demo.add_argument("--timeout", type=float, default=1500, help="seconds to wait for the DAG run")
    demo.set_defaults(func=cmd_demo)

    events = sub.add_parser("events", help="Kafka events").add_subparsers(
        dest="events_command", required=True
    )
    pub = events.add_parser("publish", help="publish one event (acks=all)")
    pub.add_argument("type", help="event type = topic, e.g. cascade.data.landed")
    pub.add_argument("--dataset")
    pub.add_argument("--partition", help="YYYY-MM-DD")
    pub.add_argument("--payload", help="JSON object merged into the payload")
    pub.set_defaults(func=cmd_publish)
    events.add_parser("dead-letters", help="count the dead-letter topic by reason").set_defaults(
        func=cmd_dead_letters
    )

    back = sub.add_parser(
        "rollback", help="point the champion alias back at the version it replaced"
    )
    back.add_argument("--reason", default="manual", help="recorded on the rolled-back version")
    back.set_defaults(func=cmd_rollback)

    step = sub.add_parser(
        "step", help="run one pipeline step (the DAG task / DVC stage of that name)"
    )
    step.add_argument("name")
    step.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    step.add_argument(
        "--pipeline",
        default="ctr_preranking",
        choices=tuple(PIPELINES),
        help="the DAG whose step it is (default ctr_preranking)",
    )
    step.set_defaults(func=cmd_step)

    score = sub.add_parser("score", help="score candidates with the served champion")
    score.add_argument("--user", type=int, required=True)
    score.add_argument("--items", type=int, nargs="+", required=True)
    score.set_defaults(func=cmd_score)

    bench = sub.add_parser("bench", help="run a benchmark, write JSON results")
    bench.add_argument("name", help="benchmark name (see cascade/bench.py)")
    bench.add_argument("--out", type=Path, required=True, help="JSON file to write")
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    for option, text in BENCH_OPTIONS.items():
        bench.add_argument(f"--{option}", help=text)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a CLI error is one clear line, not a traceback
        from cascade.events import InvalidEvent
        from infra.stack import StackError

        if isinstance(exc, (StackError, InvalidEvent, ValueError, KeyError, TimeoutError)):
            print(f"cascade {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
