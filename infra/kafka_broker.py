"""The stack's Apache Kafka: the broker's jars from Maven Central, KRaft storage, a process a node.

Install (``make venv`` runs ``python -m infra.kafka_broker install VENV``): Maven's dependency
plugin copies the artifacts that ``infra/kafka/pom.xml`` pins (``kafka_2.13`` and its runtime
dependencies) into ``VENV/kafka/libs``; each jar is then checked against
``infra/kafka/jars.sha256``. A jar that is missing, unlisted or not the recorded bytes stops the
install and is never put on a class path (:func:`prepare` checks again at every start).

Run: the ``local`` profile runs one node, broker and KRaft controller in one JVM, listening on
``CASCADE_BROKER_PORT`` (clients) and ``CASCADE_BROKER_CONTROLLER_PORT`` (the quorum), on the
stack's host only. The ``cluster`` profile runs three such nodes in one controller quorum
(``broker``, ``broker_2``, ``broker_3``), and the stack's topics get replication factor 3 and
``min.insync.replicas`` 2 (:func:`topic_config`). Each node's storage is formatted once, under
``$CASCADE_HOME/broker/<node>``, with the cluster id kept in ``$CASCADE_HOME/broker/cluster.id``;
a restart reuses both. The JVM gets a small heap sized for a 2-core machine
(``CASCADE_BROKER_HEAP_MB``) and logs to ``$CASCADE_HOME/logs/<node>.server.log``.

    python -m infra.kafka_broker install .venv     # jars, verified
    python -m infra.kafka_broker run broker        # format once, then exec the JVM (the stack)
    python -m infra.kafka_broker version           # the broker's name and version
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from cascade.config import REPO_ROOT, Settings, load_settings

POM = REPO_ROOT / "infra" / "kafka" / "pom.xml"
DIGESTS = REPO_ROOT / "infra" / "kafka" / "jars.sha256"
KAFKA_ARTIFACT = "kafka_2.13"
BROKER_NAME = "Apache Kafka"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
NODES = ("broker", "broker_2", "broker_3")
"""The stack's Kafka nodes: the ``local`` profile runs the first, ``cluster`` all three."""
CONTROLLER_PORTS = {
    "broker": "broker_controller",
    "broker_2": "broker_2_controller",
    "broker_3": "broker_3_controller",
}
"""Each node's controller (quorum) port: a field of :class:`cascade.config.Ports`."""
REPLICATION = {"local": (1, 1), "cluster": (3, 2)}
"""Per profile: (replication factor, min.insync.replicas) of the stack's topics."""


class KafkaInstallError(RuntimeError):
    """The broker's jars are missing or not the recorded ones; the message says which."""


def libs_dir(venv: Path | None = None) -> Path:
    """Where ``make venv`` puts the broker's jars: ``VENV/kafka/libs``."""
    return (venv or Path(sys.executable).parent.parent) / "kafka" / "libs"


def recorded_digests(path: Path = DIGESTS) -> dict[str, str]:
    """``file name -> sha256`` from ``infra/kafka/jars.sha256`` (``sha256sum`` format)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        digest, name = line.split()
        out[name.lstrip("*")] = digest
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(libs: Path, digests: dict[str, str] | None = None) -> list[Path]:
    """The jars of ``libs`` when they are exactly the recorded ones; else KafkaInstallError
    naming every missing, unlisted or changed jar."""
    digests = recorded_digests() if digests is None else digests
    present = {p.name: p for p in libs.glob("*.jar")} if libs.is_dir() else {}
    problems = [f"missing {name}" for name in sorted(set(digests) - set(present))]
    problems += [f"unlisted {name}" for name in sorted(set(present) - set(digests))]
    problems += [
        f"changed {name}"
        for name in sorted(set(digests) & set(present))
        if _sha256(present[name]) != digests[name]
    ]
    if problems:
        raise KafkaInstallError(
            f"Kafka broker jars in {libs} do not match infra/kafka/jars.sha256 "
            f"({'; '.join(problems[:6])}{' ...' if len(problems) > 6 else ''}); "
            "run `make venv` to install them again"
        )
    return [present[name] for name in sorted(digests)]


def install(venv: Path, *, mvn: str = "mvn") -> list[Path]:
    """Copy the pinned jars into ``venv``'s ``kafka/libs`` with Maven and verify them; the
    folder is replaced only once the new copy passed. Returns the verified jars."""
    libs = libs_dir(venv.resolve())
    try:
        return verify(libs)
    except KafkaInstallError:
        pass
    if shutil.which(mvn) is None:
        raise KafkaInstallError("Maven (mvn) is not installed; `apt-get install maven`")
    staging = Path(tempfile.mkdtemp(prefix="kafka-libs-", dir=libs.parent.parent))
    try:
        # The POM is copied out of the repository so Maven's target/ never lands in it.
        shutil.copy(POM, staging / "pom.xml")
        subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-Dstyle.color=never",
                "-f",
                str(staging / "pom.xml"),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging / 'libs'}",
            ],
            check=True,
        )
        names = [jar.name for jar in verify(staging / "libs")]
        if libs.exists():
            shutil.rmtree(libs)
        libs.parent.mkdir(parents=True, exist_ok=True)
        (staging / "libs").rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [libs / name for name in names]


def version(digests: dict[str, str] | None = None) -> str:
    """The pinned broker version (from the recorded ``kafka_2.13-VERSION.jar``)."""
    digests = recorded_digests() if digests is None else digests
    for name in digests:
        if name.startswith(f"{KAFKA_ARTIFACT}-") and name.endswith(".jar"):
            return name[len(KAFKA_ARTIFACT) + 1 : -len(".jar")]
    raise KafkaInstallError(f"no {KAFKA_ARTIFACT} jar in {DIGESTS}")


def broker_info() -> dict[str, str]:
    """The broker's name and version, as ``cascade status`` shows them."""
    return {"name": BROKER_NAME, "version": version()}


@dataclass(frozen=True)
class Node:
    name: str
    node_id: int
    port: int
    controller_port: int


def nodes(settings: Settings, *, every: bool = False) -> list[Node]:
    """The Kafka nodes the stack runs in the settings' profile (``every``: all three, whatever
    the profile)."""
    count = 3 if every or settings.profile == "cluster" else 1
    return [
        Node(
            name,
            i + 1,
            getattr(settings.ports, name),
            getattr(settings.ports, CONTROLLER_PORTS[name]),
        )
        for i, name in enumerate(NODES[:count])
    ]


def replication(settings: Settings) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of the stack's Kafka in the settings' profile."""
    return REPLICATION["cluster" if settings.profile == "cluster" else "local"]


def topic_config(settings: Settings) -> tuple[int, dict[str, str]]:
    """(replication factor, topic configs) of the stack's topics in the settings' profile."""
    factor, min_isr = replication(settings)
    return factor, {"min.insync.replicas": str(min_isr)}


def state_dir(settings: Settings) -> Path:
    return settings.home / "broker"


def server_properties(settings: Settings, node: Node) -> str:
    """The node's ``server.properties``: broker and controller in one process, loopback only."""
    all_nodes = nodes(settings)
    factor, min_isr = replication(settings)
    host = settings.host
    voters = ",".join(f"{n.node_id}@{host}:{n.controller_port}" for n in all_nodes)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{node.port},CONTROLLER://{host}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(state_dir(settings) / node.name),
        "num.partitions": "1",
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(factor),
        "offsets.topic.num.partitions": "1" if factor == 1 else "3",
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "1" if factor == 1 else "3",
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # Two cores: a few threads each, not Kafka's server-sized defaults.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "2",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(8 << 20),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def log4j_properties(log_file: Path) -> str:
    return (
        "status = warn\n"
        # Kafka's own shutdown hook logs the controlled shutdown; log4j's would stop first.
        "shutdownHook = disable\n"
        "appender.file.type = File\n"
        "appender.file.name = file\n"
        f"appender.file.fileName = {log_file}\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.file.ref = file\n"
        "logger.state.name = state.change.logger\n"
        "logger.state.level = WARN\n"
    )


def cluster_id(settings: Settings) -> str:
    """The KRaft cluster id of the stack, made once (base64url of a random UUID, as Kafka's
    ``random-uuid`` prints it, drawn again while it starts with ``-`` as Kafka's own are: a
    command line would read it as an option) and kept under the state folder."""
    path = state_dir(settings) / "cluster.id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        raw = "-"
        while raw.startswith("-"):
            raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        path.write_text(raw + "\n")
    return path.read_text().strip()


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise KafkaInstallError("java is not installed; run `make venv`")
    return found


def jvm_command(settings: Settings, libs: list[Path], log4j: Path) -> list[str]:
    """``java`` with the node's flags and class path, up to the main class."""
    heap = settings.broker_heap_mb
    return [
        java(),
        f"-Xms{min(128, heap)}m",
        f"-Xmx{heap}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        os.pathsep.join(str(p) for p in libs),
    ]


def prepare(settings: Settings, node: Node) -> list[str]:
    """Verify the jars, write the node's configuration and log settings, and format its storage
    once; returns the command that runs the node."""
    config_dir = state_dir(settings) / "config"
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = config_dir / f"{node.name}.properties"
    config.write_text(server_properties(settings, node))
    log4j = config_dir / f"{node.name}.log4j2.properties"
    log4j.write_text(log4j_properties(settings.logs_dir / f"{node.name}.server.log"))
    jvm = jvm_command(settings, verify(libs_dir()), log4j)
    if not (state_dir(settings) / node.name / "meta.properties").exists():
        subprocess.run(
            # One argument with its value: an id kept from before may start with "-".
            [*jvm, STORAGE_TOOL, "format", "--ignore-formatted"]
            + [f"--cluster-id={cluster_id(settings)}", "-c", str(config)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return [*jvm, MAIN_CLASS, str(config)]


def node_named(settings: Settings, name: str) -> Node:
    for node in nodes(settings):
        if node.name == name:
            return node
    raise KafkaInstallError(f"{name} is not a Kafka node of the {settings.profile} profile")


def run(name: str) -> None:
    """Format once, then replace this process with the node's JVM (same pid: the stack stops
    it with SIGTERM, Kafka's controlled shutdown)."""
    settings = load_settings()
    command = prepare(settings, node_named(settings, name))
    sys.stdout.flush()
    os.execv(command[0], command)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.kafka_broker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="copy and verify the broker's jars")
    inst.add_argument("venv", type=Path)
    runp = sub.add_parser("run", help="start one node of the stack's Kafka")
    runp.add_argument("node", choices=NODES)
    sub.add_parser("version", help="print the broker's name and version")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            jars = install(args.venv)
            print(
                f"install: {BROKER_NAME} {version()} "
                f"({len(jars)} verified jars in {libs_dir(args.venv.resolve())})"
            )
        elif args.command == "run":
            run(args.node)
        else:
            info = broker_info()
            print(f"{info['name']} {info['version']}")
    except KafkaInstallError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
