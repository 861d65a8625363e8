"""The local stack: start, health-check, report and stop the broker, MLflow, Airflow and serving.

Each service runs in its own process group; its pid/pgid, command and log live under
``$CASCADE_HOME/run`` and ``$CASCADE_HOME/logs``. ``stop`` signals exactly the process groups
that ``start`` recorded, so nothing else on the machine is touched.

    cascade up        # start what is not running, wait until healthy
    cascade status    # each service: up/down, URL, pid
    cascade down      # stop what `cascade up` started
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from cascade.airflow_client import airflow_home, airflow_password_file, ensure_airflow_password
from cascade.assets import KAFKA_CONN_ID
from cascade.config import REPO_ROOT, Settings, load_settings, scoped_environ
from cascade.ports import free_ports
from cascade.state import SERVICE_UMASK, exposed_secrets, secure_state_folder
from cascade.tracking_auth import (
    credentials_file,
    ensure_tracking_credentials,
    is_stack_tracking,
    tracking_credentials_env,
    tracking_server_env,
)

SERVICES = ("broker", "mlflow", "airflow", "serving", "asr_serving")


class StackError(RuntimeError):
    """A service could not be started or stopped; the message says which and what to do."""


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    port: int
    command: list[str]
    env: dict[str, str]
    url: str
    healthy: Callable[[], bool]
    start_timeout_s: float


@dataclass(frozen=True)
class ServiceState:
    name: str
    up: bool
    healthy: bool
    url: str
    pid: int | None
    log: Path


def venv_bin() -> Path:
    return Path(sys.executable).parent


def broker_binary() -> Path:
    """The broker binary inside the ``noida-db`` wheel.

    Its console script is a wrapper that would not pass signals on."""
    import importlib.util

    spec = importlib.util.find_spec("noida_db")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the broker package noida-db is not installed; run `make venv`")
    binary = Path(spec.submodule_search_locations[0]) / "noida-db"
    if not binary.exists():
        raise StackError(f"broker binary missing at {binary}; reinstall noida-db")
    return binary


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code < 500
    except requests.RequestException:
        return False


def airflow_healthy(settings: Settings) -> bool:
    try:
        body = requests.get(f"{settings.airflow_url}/api/v2/monitor/health", timeout=3).json()
    except (requests.RequestException, ValueError):
        return False
    needed = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all(body.get(k, {}).get("status") == "healthy" for k in needed)


def service_env(settings: Settings) -> dict[str, str]:
    """Environment every service and every Airflow task inherits: with the local stack's
    tracking server, its MLflow credentials too (the environment of a process is its owner's
    only; no log prints it)."""
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}",
            "CASCADE_HOME": str(settings.home),
            "CASCADE_PROFILE": settings.profile,
            "CASCADE_BROKER_PORT": str(settings.ports.broker),
            "CASCADE_AIRFLOW_PORT": str(settings.ports.airflow),
            "CASCADE_MLFLOW_PORT": str(settings.ports.mlflow),
            "CASCADE_SERVING_PORT": str(settings.ports.serving),
            "CASCADE_ASR_SERVING_PORT": str(settings.ports.asr_serving),
            "MLFLOW_TRACKING_URI": settings.tracking_uri,
            "SPARK_LOCAL_IP": settings.host,
            "DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu"),
            "PYTHONUNBUFFERED": "1",
            **tracking_credentials_env(settings),
        }
    )
    return env


def airflow_env(settings: Settings) -> dict[str, str]:
    home = airflow_home(settings)
    port = settings.ports.airflow
    kafka_conn = {
        "conn_type": "kafka",
        "extra": {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": "cascade-airflow",
            "auto.offset.reset": "earliest",
            # The shared-stream watcher commits only after asset events are stored; it refuses
            # to start with auto-commit on (cascade/events.py explains the delivery chain).
            "enable.auto.commit": "false",
        },
    }
    env = service_env(settings)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(settings.airflow_parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(settings.airflow_parallelism),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{settings.host}:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            # Written 0600 by ensure_airflow_password before Airflow starts, so Airflow never
            # generates (and prints) one.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                airflow_password_file(settings)
            ),
            "AIRFLOW__API__HOST": settings.host,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://{settings.host}:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            f"AIRFLOW_CONN_{KAFKA_CONN_ID.upper()}": json.dumps(kafka_conn),
        }
    )
    return env


def service_specs(settings: Settings) -> dict[str, ServiceSpec]:
    host, ports, home = settings.host, settings.ports, settings.home
    py = sys.executable
    mlflow_dir = home / "mlflow"
    return {
        "broker": ServiceSpec(
            name="broker",
            port=ports.broker,
            command=[
                str(broker_binary()),
                "start",
                "--only",
                "kafka",
                "--kafka-port",
                str(ports.broker),
                "--host",
                host,
                "--data-dir",
                str(home / "broker"),
            ],
            env=service_env(settings),
            url=f"kafka://{host}:{ports.broker}",
            healthy=lambda: port_open(host, ports.broker),
            start_timeout_s=30,
        ),
        "mlflow": ServiceSpec(
            name="mlflow",
            port=ports.mlflow,
            command=[
                py,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{mlflow_dir / 'mlflow.db'}",
                "--artifacts-destination",
                str(mlflow_dir / "artifacts"),
                "--host",
                host,
                "--port",
                str(ports.mlflow),
                "--workers",
                "1",
                # Every request but /health needs a user (401 without one); the configuration,
                # user store and admin password live under the state folder (cascade.tracking_auth).
                "--app-name",
                "basic-auth",
            ],
            env={**service_env(settings), **tracking_server_env(settings)},
            url=settings.tracking_uri,
            healthy=lambda: http_ok(f"{settings.tracking_uri}/health"),
            start_timeout_s=120,
        ),
        "airflow": ServiceSpec(
            name="airflow",
            port=ports.airflow,
            command=[py, "-m", "infra.airflow_local"],
            env=airflow_env(settings),
            url=settings.airflow_url,
            healthy=lambda: airflow_healthy(settings),
            start_timeout_s=240,
        ),
        "serving": ServiceSpec(
            name="serving",
            port=ports.serving,
            command=[py, "-m", "serving.server"],
            env=service_env(settings),
            url=settings.serving_url,
            healthy=lambda: http_ok(f"{settings.serving_url}/v2/health/live"),
            start_timeout_s=120,
        ),
        # Follows the registry's asr champion; live (not ready) until one exists.
        "asr_serving": ServiceSpec(
            name="asr_serving",
            port=ports.asr_serving,
            command=[py, "-m", "serving.asr"],
            env=service_env(settings),
            url=settings.asr_serving_url,
            healthy=lambda: http_ok(f"{settings.asr_serving_url}/v2/health/live"),
            start_timeout_s=120,
        ),
    }


def _run_dir(settings: Settings) -> Path:
    return settings.home / "run"


def _pid_file(settings: Settings, name: str) -> Path:
    return _run_dir(settings) / f"{name}.json"


def _log_file(settings: Settings, name: str) -> Path:
    return settings.logs_dir / f"{name}.log"


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: a service killed
    with SIGKILL stays a zombie until its parent reaps it, and must not pass for running."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)  # reap the leader if it is our exited child
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def _recorded(settings: Settings, name: str) -> dict | None:
    try:
        return json.loads(_pid_file(settings, name).read_text())
    except (OSError, ValueError):
        return None


def _running_pgid(settings: Settings, name: str) -> int | None:
    record = _recorded(settings, name)
    if record and _group_alive(int(record["pgid"])):
        return int(record["pgid"])
    return None


def state(settings: Settings, name: str) -> ServiceState:
    spec = service_specs(settings)[name]
    pgid = _running_pgid(settings, name)
    return ServiceState(
        name=name,
        up=pgid is not None,
        healthy=pgid is not None and spec.healthy(),
        url=spec.url,
        pid=pgid,
        log=_log_file(settings, name),
    )


def start_service(
    settings: Settings, name: str, *, echo: Callable[[str], None] = print
) -> ServiceState:
    spec = service_specs(settings)[name]
    if _running_pgid(settings, name) is not None:
        echo(f"{name}: already running (pid {_running_pgid(settings, name)})")
    else:
        if port_open(settings.host, spec.port):
            raise StackError(
                f"{name}: port {spec.port} on {settings.host} is already taken by another process; "
                f"stop it or choose another port with CASCADE_{name.upper()}_PORT"
            )
        secure_state_folder(settings.home)
        for folder in (settings.logs_dir, _run_dir(settings)):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if name == "airflow":
            ensure_airflow_password(settings)
        if is_stack_tracking(settings):
            # Before any service starts: each one's environment carries the credentials.
            ensure_tracking_credentials(settings)
        spec = service_specs(settings)[name]
        log_path = _log_file(settings, name)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "ab") as log:
            log.write(
                f"\n=== start {time.strftime('%Y-%m-%dT%H:%M:%S')} "
                f"{' '.join(spec.command)}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                spec.command,
                env=spec.env,
                cwd=str(REPO_ROOT),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Whatever a service writes (airflow.cfg with its signing keys, databases,
                # logs) is the owner's only.
                umask=SERVICE_UMASK,
            )
        _pid_file(settings, name).write_text(
            json.dumps(
                {"pid": proc.pid, "pgid": proc.pid, "command": spec.command, "port": spec.port}
            )
        )
        echo(f"{name}: started (pid {proc.pid}), log {log_path}")
    deadline = time.monotonic() + spec.start_timeout_s
    while time.monotonic() < deadline:
        if spec.healthy():
            echo(f"{name}: healthy at {spec.url}")
            return state(settings, name)
        if _running_pgid(settings, name) is None:
            raise StackError(f"{name}: exited during start-up; see {_log_file(settings, name)}")
        time.sleep(1)
    raise StackError(
        f"{name}: not healthy after {spec.start_timeout_s:.0f} s; see {_log_file(settings, name)}"
    )


def _descendants(pid: int) -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return {}


def _still_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_service(
    settings: Settings, name: str, *, grace_s: float = 30, echo: Callable[[str], None] = print
) -> bool:
    """Stop what ``start`` started; True if something was stopped.

    That is the recorded process group plus every descendant seen while stopping: Airflow
    runs each task in a process group of its own, and ``torch.distributed.run`` starts its
    workers in new sessions, so a group signal alone would leave a running training behind.
    """
    record = _recorded(settings, name)
    pgid = _running_pgid(settings, name)
    if pgid is None:
        _pid_file(settings, name).unlink(missing_ok=True)
        return False
    assert record is not None
    main_pid = int(record["pid"])
    family = _descendants(main_pid)
    # The main process gets SIGTERM first so it can save state (the broker writes its
    # snapshot, Airflow stops its components); stragglers follow.
    try:
        os.kill(main_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s / 2
    while time.monotonic() < deadline and _pid_alive(main_pid):
        family.update(_descendants(main_pid))
        time.sleep(0.2)
    # A killed process leaves the table only once reaped; a loaded machine needs seconds.
    for sig, wait_s in ((signal.SIGTERM, grace_s / 2), (signal.SIGKILL, 20.0)):
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        # _pid_alive reaps the main process when it is our child, so its zombie does not
        # keep the group looking alive.
        while time.monotonic() < deadline and (_pid_alive(main_pid) or _group_alive(pgid)):
            time.sleep(0.2)
    leftovers = [p for p in family.values() if _still_running(p)]
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(leftovers, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=20)
    if _group_alive(pgid) or any(_still_running(p) for p in family.values()):
        raise StackError(f"{name}: processes of group {pgid} survived SIGKILL")
    _pid_file(settings, name).unlink(missing_ok=True)
    escaped = f", and {len(leftovers)} processes outside its group" if leftovers else ""
    echo(f"{name}: stopped (pid {pgid}{escaped})")
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of this process counts as gone.
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == 0
    except ChildProcessError:
        return True


def up(
    settings: Settings | None = None,
    services: tuple[str, ...] = SERVICES,
    *,
    echo: Callable[[str], None] = print,
) -> list[ServiceState]:
    settings = settings or load_settings()
    states = []
    for name in services:
        states.append(start_service(settings, name, echo=echo))
        if name == "broker":
            from cascade.broker import ensure_topics

            created = ensure_topics(settings)
            if created:
                echo(f"broker: created topics {', '.join(created)}")
        elif name == "airflow":
            echo(ensure_heavy_pool(settings))
    return states


def heavy_slots(settings: Settings) -> int:
    """Slots of the heavy steps' pool: ``CASCADE_AIRFLOW_HEAVY_SLOTS``, else the parallelism.

    The default keeps the stack's behaviour as it was (the parallelism already bounds every
    task); a lower value keeps Spark jobs and trainings apart while light tasks run beside."""
    return settings.airflow_heavy_slots or settings.airflow_parallelism


def ensure_heavy_pool(settings: Settings, client: Any = None) -> str:
    """Create the Airflow pool of the heavy steps, or set its slots, through Airflow's REST API;
    returns what it did. Airflow holds a task of a missing pool as scheduled (never run), so
    the stack makes the pool before it answers that Airflow is up."""
    from cascade.airflow_client import AirflowClient
    from cascade.pipeline_spec import HEAVY_POOL

    client = client or AirflowClient(settings)
    slots = heavy_slots(settings)
    try:
        current = client.get(f"/pools/{HEAVY_POOL}")
    except requests.HTTPError as exc:
        if exc.response is None or exc.response.status_code != 404:
            raise
        current = None
    if current is None:
        client.post(
            "/pools",
            {
                "name": HEAVY_POOL,
                "slots": slots,
                "description": "Spark jobs, trainings and compiles (steps marked heavy)",
                "include_deferred": False,
            },
        )
        return f"airflow: created pool {HEAVY_POOL} with {slots} slots"
    before = current.get("slots")
    if before != slots:
        client.patch(f"/pools/{HEAVY_POOL}?update_mask=slots", {"slots": slots})
        return f"airflow: pool {HEAVY_POOL} now has {slots} slots (was {before})"
    return f"airflow: pool {HEAVY_POOL} has {slots} slots"


def down(
    settings: Settings | None = None,
    services: tuple[str, ...] = SERVICES,
    *,
    echo: Callable[[str], None] = print,
) -> list[str]:
    settings = settings or load_settings()
    # Reverse order: consumers of the broker and registry go first.
    return [name for name in reversed(services) if stop_service(settings, name, echo=echo)]


def secret_files(settings: Settings) -> list[Path]:
    """The files of the local stack that hold secrets: the Airflow admin password,
    ``airflow.cfg`` (Airflow writes its JWT and API signing keys there) and MLflow's
    credentials."""
    home = airflow_home(settings)
    return [airflow_password_file(settings), home / "airflow.cfg", credentials_file(settings)]


def world_readable_secrets(settings: Settings | None = None) -> list[Path]:
    """The state folder and secret files that another user could read (should be empty)."""
    settings = settings or load_settings()
    return exposed_secrets(settings.home, secret_files(settings))


def status(settings: Settings | None = None) -> list[ServiceState]:
    settings = settings or load_settings()
    return [state(settings, name) for name in SERVICES]


@contextlib.contextmanager
def private_stack(
    home: Path,
    *,
    services: Sequence[str] = SERVICES,
    env: dict[str, str] | None = None,
) -> Iterator[Settings]:
    """Start ``services`` in state folder ``home`` on free ports; stop them (by pid) on exit.

    For tests and benchmarks that must not touch a developer's running stack. ``env`` is set
    for the duration (the services and their tasks inherit it), and so are the stack's MLflow
    credentials: the caller's own MLflow clients authenticate like the services'.
    """
    overrides = {"CASCADE_HOME": str(home), **(env or {})}
    for name, port in zip(SERVICES, free_ports(len(SERVICES)), strict=True):
        overrides[f"CASCADE_{name.upper()}_PORT"] = str(port)
    with scoped_environ(overrides):
        settings = load_settings()
        if is_stack_tracking(settings):
            ensure_tracking_credentials(settings)
        with scoped_environ(tracking_credentials_env(settings)):
            try:
                up(settings, tuple(services))
                yield settings
            finally:
                down(settings, tuple(services))
