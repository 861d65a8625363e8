"""The stack's commands of the ``cascade`` CLI: ``up``, ``down``, ``status``, ``demo``,
``manifests``.

Registered under the ``cascade.commands`` entry point (``pyproject.toml``), so the kernel's CLI
offers them without importing this layer.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from typing import Any

from cascade.config import PROFILES, load_settings


def _print_status(settings: Any) -> None:
    from cascade.airflow_client import airflow_password, airflow_password_file
    from cascade.tracking_auth import credentials_file, tracking_credentials
    from infra.stack import status

    print(f"profile {settings.profile}, state folder {settings.home}")
    broker = broker_status(settings)
    print(
        f"  Kafka: {broker['name']} {broker['version'] or ''} at {broker['bootstrap']}"
        + (f" ({broker['nodes']} nodes)" if broker["nodes"] > 1 else "")
    )
    for s in status(settings):
        mark = "up" if s.healthy else ("starting/unhealthy" if s.up else "down")
        pid = f"pid {s.pid}" if s.pid else "-"
        print(f"  {s.name:<8} {mark:<18} {s.url:<32} {pid:<12} log {s.log}")
    workers = _airflow_workers(settings)
    if workers is not None:
        from infra.airflow_cluster import worker_names

        shown = ", ".join(workers) if workers else "none"
        print(
            f"  Airflow Celery workers answering: {len(workers)} of {len(worker_names())} ({shown})"
        )
    if airflow_password(settings):
        # The file's path, not the password: terminal output ends up in logs and CI output.
        print(
            f"Airflow UI {settings.airflow_url}  user admin  password in "
            f"{airflow_password_file(settings)}"
        )
    if tracking_credentials(settings):
        print(
            f"MLflow UI  {settings.tracking_uri}  user admin  password in "
            f"{credentials_file(settings)}"
        )


def _airflow_workers(settings: Any) -> list[str] | None:
    """The cluster profile's Celery workers that answer a ping (None in the local profile, whose
    Airflow runs its tasks itself)."""
    if settings.profile != "cluster":
        return None
    from infra.airflow_cluster import answering_workers

    return answering_workers(settings)


def cmd_up(args: argparse.Namespace) -> int:
    from infra import cluster
    from infra.stack import up

    if args.profile:
        # For this command and everything it starts (the services inherit the environment).
        os.environ["CASCADE_PROFILE"] = args.profile
    settings = load_settings()
    if cluster.remote(settings):
        # Someone else's services: start no local copy beside them, check each one answers
        # (ClusterUnreachable: exit 3 with the unreachable ones on one line).
        cluster.check(settings)
        return 0
    up(settings)
    _print_status(settings)
    if args.profile and args.profile != _saved_profile():
        print(
            f"the stack runs the {args.profile} profile: export CASCADE_PROFILE={args.profile} "
            "(or put it in the settings file) for the commands that use it"
        )
    return 0


def _saved_profile() -> str:
    """The profile later commands load when they are given none."""
    saved = {k: v for k, v in os.environ.items() if k != "CASCADE_PROFILE"}
    return load_settings(saved).profile


def cmd_down(args: argparse.Namespace) -> int:
    from infra.stack import down

    stopped = down(load_settings())
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def broker_status(settings: Any) -> dict[str, Any]:
    """The event bus: the stack's own Apache Kafka (name and pinned version) or the external
    cluster the settings name."""
    from infra import kafka_broker

    if not settings.local_broker:
        return {
            "name": "external Kafka",
            "version": None,
            "bootstrap": settings.bootstrap_servers,
            "nodes": len(settings.bootstrap_servers.split(",")),
        }
    info = kafka_broker.broker_info()
    return {
        **info,
        "bootstrap": settings.bootstrap_servers,
        "nodes": len(kafka_broker.nodes(settings)),
    }


def status_json(settings: Any) -> dict[str, Any]:
    """What ``cascade status --json`` prints: each service's state, and where the admin
    passwords are (their files, never the passwords)."""
    from cascade.airflow_client import airflow_password, airflow_password_file
    from cascade.tracking_auth import credentials_file, tracking_credentials
    from infra.stack import status

    return {
        "profile": settings.profile,
        "home": str(settings.home),
        "broker": broker_status(settings),
        "services": [
            {
                "name": s.name,
                "state": "up" if s.healthy else ("starting/unhealthy" if s.up else "down"),
                "healthy": s.healthy,
                "url": s.url,
                "pid": s.pid,
                "log": str(s.log),
            }
            for s in status(settings)
        ],
        "airflow_workers": _airflow_workers(settings),
        "password_files": {
            "airflow": str(airflow_password_file(settings)) if airflow_password(settings) else None,
            "mlflow": str(credentials_file(settings)) if tracking_credentials(settings) else None,
        },
    }


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 when every service is healthy, 3 (not ready) otherwise, so scripts and probes can
    wait on ``cascade status``."""
    settings = load_settings()
    shown = status_json(settings)
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        _print_status(settings)
    unhealthy = [s["name"] for s in shown["services"] if not s["healthy"]]
    if unhealthy:
        print(
            f"not healthy: {', '.join(unhealthy)}; start the stack with `cascade up` "
            "(logs: the paths above)",
            file=sys.stderr,
        )
        return 3
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from infra.demo import run_demo

    summary = run_demo(ds=args.ds, timeout_s=args.timeout)
    return 0 if summary["dag_run_state"] == "success" else 1


def register(sub: Any) -> tuple[type[BaseException], ...]:
    """Add the stack's subcommands; returns the errors the CLI reports as one line."""
    from infra.services import StackError

    start = sub.add_parser(
        "up",
        help="start the local stack and wait until healthy (cluster profile with remote hosts: "
        "check that each configured service answers, start nothing)",
    )
    start.add_argument(
        "--profile",
        choices=PROFILES,
        help="the stack profile (default: CASCADE_PROFILE); cluster on this machine: PostgreSQL, "
        "Redis, Spark standalone and Celery workers beside the local services",
    )
    start.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop what `cascade up` started").set_defaults(func=cmd_down)
    shown = sub.add_parser("status", help="each service: up/down, URL, pid")
    shown.add_argument("--json", action="store_true", help="print JSON")
    shown.set_defaults(func=cmd_status)
    demo = sub.add_parser("demo", help="start the stack and run the pre-ranking path end to end")
    demo.add_argument(
        "--ds", default=dt.datetime.now(dt.UTC).date().isoformat(), help="partition date"
    )
    demo.add_argument("--timeout", type=float, default=1500, help="seconds to wait for the DAG run")
    demo.set_defaults(func=cmd_demo)
    from infra.manifests import register_command

    register_command(sub)
    return (StackError,)
