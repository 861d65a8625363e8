"""The local stack: start, health-check, report and stop the broker, MLflow, Airflow and serving,
and, in the ``cluster`` profile, the data services PostgreSQL and Redis.

Each service runs in its own process group; its pid/pgid, command and log live under
``$CASCADE_HOME/run`` and ``$CASCADE_HOME/logs``. ``stop`` signals exactly the process groups
that ``start`` recorded, so nothing else on the machine is touched.

    cascade up        # start what is not running, wait until healthy
    cascade status    # each service: up/down, URL, pid
    cascade down      # stop what `cascade up` started

PostgreSQL and Redis run only with ``CASCADE_PROFILE=cluster``
(:func:`infra.services.stack_services`), on loopback like the rest, with their data folders
and generated passwords under the state folder (:mod:`cascade.data_services`); ``initdb``
runs at the first start. In that profile Airflow keeps its metadata in that PostgreSQL and
runs its tasks on two Celery workers fed through that Redis (:mod:`infra.airflow_cluster`);
``cascade status`` lists the workers that answer.

What each service runs, its environment and health check are :mod:`infra.services`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from cascade.airflow_client import airflow_home, airflow_password_file, ensure_airflow_password
from cascade.config import PORT_NAMES, REPO_ROOT, Settings, load_settings, scoped_environ
from cascade.data_services import (
    DATABASE_ROLES,
    postgres_password_file,
    postgres_role_password_file,
    redis_config_file,
    redis_password_file,
    redis_reader_password_file,
)
from cascade.ports import free_ports
from cascade.serving_token import ensure_serving_token, serving_token_env, token_file
from cascade.signing import ensure_signing_key
from cascade.state import SERVICE_UMASK, exposed_secrets, secure_state_folder
from cascade.tracking_auth import (
    ROLES,
    credentials_file,
    ensure_tracking_credentials,
    is_stack_tracking,
    role_file,
    tracking_credentials_env,
)
from infra import kafka_broker
from infra.services import (
    AFTER_START,
    PREPARE,
    SERVICES,
    StackError,
    log_file,
    port_open,
    service_specs,
    stack_services,
)
from infra.supervise import lose_node

STOP_SIGNALS = {"postgres": signal.SIGINT}
"""The first signal of a service whose SIGTERM would not stop it promptly: PostgreSQL's
SIGTERM waits for every client to disconnect, SIGINT is its fast shutdown."""


@dataclass(frozen=True)
class ServiceState:
    name: str
    up: bool
    healthy: bool
    url: str
    pid: int | None
    log: Path


def _run_dir(settings: Settings) -> Path:
    return settings.home / "run"


def _pid_file(settings: Settings, name: str) -> Path:
    return _run_dir(settings) / f"{name}.json"


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
        log=log_file(settings, name),
    )


def start_service(
    settings: Settings, name: str, *, echo: Callable[[str], None] = print, wait: bool = True
) -> ServiceState:
    """Start ``name`` unless it runs; with ``wait``, until it is healthy (StackError if it exits
    or is not healthy in its time)."""
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
        if name in PREPARE:
            PREPARE[name](settings)
        if is_stack_tracking(settings):
            # Before any service starts: each one's environment carries the credentials.
            ensure_tracking_credentials(settings)
        ensure_serving_token(settings)
        ensure_signing_key(settings.home)
        spec = service_specs(settings)[name]
        log_path = log_file(settings, name)
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
    if not wait:
        return state(settings, name)
    found = wait_healthy(settings, name, echo=echo)
    if name in AFTER_START:
        AFTER_START[name](settings)
    return found


def wait_healthy(
    settings: Settings, name: str, *, echo: Callable[[str], None] = print
) -> ServiceState:
    """Wait until the started service ``name`` is healthy; StackError if it exits first or is
    not healthy within its start time."""
    spec = service_specs(settings)[name]
    deadline = time.monotonic() + spec.start_timeout_s
    while time.monotonic() < deadline:
        if spec.healthy():
            echo(f"{name}: healthy at {spec.url}")
            return state(settings, name)
        if _running_pgid(settings, name) is None:
            raise StackError(
                f"{name}: exited during start-up; see {log_file(settings, name)}"
                + _log_tail(log_file(settings, name))
            )
        time.sleep(1)
    raise StackError(
        f"{name}: not healthy after {spec.start_timeout_s:.0f} s; see {log_file(settings, name)}"
    )


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a service's log, indented, for an error message ('' if none)."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n  | {line}" for line in tail)


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
        os.kill(main_pid, STOP_SIGNALS.get(name, signal.SIGTERM))
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


def kill_service(settings: Settings, name: str, *, timeout_s: float = 20) -> int:
    """SIGKILL a running service's process and everything under it (as a lost host,
    :func:`infra.supervise.lose_node`), with no clean shutdown, and wait until its group is gone;
    returns the killed group's id. For fault tests."""
    pgid = _running_pgid(settings, name)
    if pgid is None:
        raise StackError(f"{name}: not running, nothing to kill")
    with contextlib.suppress(psutil.NoSuchProcess):
        lose_node(psutil.Process(pgid), wait_s=timeout_s)
    if _group_alive(pgid):
        raise StackError(f"{name}: group {pgid} survived SIGKILL")
    _pid_file(settings, name).unlink(missing_ok=True)
    return pgid


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
    services: tuple[str, ...] | None = None,
    *,
    echo: Callable[[str], None] = print,
) -> list[ServiceState]:
    """Start ``services`` (default: the profile's, :func:`stack_services`) in order."""
    settings = settings or load_settings()
    services = stack_services(settings) if services is None else services
    states = []
    kafka = [name for name in services if name in kafka_broker.NODES]
    for name in services:
        if name in kafka:
            # A quorum of several nodes elects its leader only once a majority runs: all of
            # them start before any is waited for.
            if name != kafka[0]:
                continue
            for node in kafka:
                start_service(settings, node, echo=echo, wait=False)
            states.extend(wait_healthy(settings, node, echo=echo) for node in kafka)
            if settings.local_broker:
                echo(ensure_stack_topics(settings))
            continue
        states.append(start_service(settings, name, echo=echo))
        if name == "airflow":
            echo(ensure_heavy_pool(settings))
    return states


def ensure_stack_topics(settings: Settings) -> str:
    """Create the platform's topics on the stack's Kafka, replicated as the profile says."""
    from cascade.broker import ensure_topics

    replication, config = kafka_broker.topic_config(settings)
    created = ensure_topics(settings, replication=replication, config=config)
    if created:
        return f"broker: created topics {', '.join(created)} (replication {replication})"
    return "broker: topics present"


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
    """Stop what runs of ``services`` (default: all, whichever profile started them)."""
    settings = settings or load_settings()
    stopped: list[str] = []
    # Reverse order: consumers of the broker and registry go first. The Kafka nodes stop
    # together: a node's controlled shutdown asks the controller quorum, which the nodes
    # stopped before it have already left (the last one would wait out its timeout alone).
    kafka = [name for name in reversed(services) if name in kafka_broker.NODES]
    for name in reversed(services):
        if name in kafka_broker.NODES:
            if name == kafka[0]:
                with ThreadPoolExecutor(max_workers=len(kafka)) as pool:
                    done = pool.map(lambda node: stop_service(settings, node, echo=echo), kafka)
                    stopped += [node for node, ok in zip(kafka, done, strict=True) if ok]
            continue
        if stop_service(settings, name, echo=echo):
            stopped.append(name)
    return stopped


def secret_files(settings: Settings) -> list[Path]:
    """The files of the local stack that hold secrets: the Airflow admin password,
    ``airflow.cfg`` (Airflow writes its JWT and API signing keys there), MLflow's
    credentials, the PostgreSQL and Redis passwords (``redis.conf`` holds Redis's) and the model
    servers' token."""
    home = airflow_home(settings)
    return [
        token_file(settings),
        airflow_password_file(settings),
        home / "airflow.cfg",
        credentials_file(settings),
        *(role_file(settings, role) for role in ROLES),
        postgres_password_file(settings),
        *(postgres_role_password_file(settings, database) for database in DATABASE_ROLES),
        redis_password_file(settings),
        redis_reader_password_file(settings),
        redis_config_file(settings),
    ]


def world_readable_secrets(settings: Settings | None = None) -> list[Path]:
    """The state folder and secret files that another user could read (should be empty)."""
    settings = settings or load_settings()
    return exposed_secrets(settings.home, secret_files(settings))


def status(settings: Settings | None = None) -> list[ServiceState]:
    settings = settings or load_settings()
    return [state(settings, name) for name in stack_services(settings)]


@contextlib.contextmanager
def private_stack(
    home: Path,
    *,
    services: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Settings]:
    """Start ``services`` (default: the profile's) in state folder ``home`` on free ports; stop
    them (by pid) on exit.

    For tests and benchmarks that must not touch a developer's running stack. ``env`` is set
    for the duration (the services and their tasks inherit it), and so are the stack's MLflow
    credentials and model servers' token: the caller's own clients authenticate like the
    services'.
    """
    overrides = {"CASCADE_HOME": str(home), **(env or {})}
    for name, port in zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True):
        overrides[f"CASCADE_{name.upper()}_PORT"] = str(port)
    with scoped_environ(overrides):
        settings = load_settings()
        if is_stack_tracking(settings):
            ensure_tracking_credentials(settings)
        ensure_serving_token(settings)
        ensure_signing_key(settings.home)
        chosen = stack_services(settings) if services is None else tuple(services)
        with scoped_environ({**tracking_credentials_env(settings), **serving_token_env(settings)}):
            settings = load_settings()  # with the servers' token, when the stack's stands in
            try:
                up(settings, chosen)
                yield settings
            finally:
                down(settings, chosen)
