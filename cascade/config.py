"""Typed settings: every ``CASCADE_*`` variable is one documented field of one group.

:class:`Settings` is the root the kernel and every layer above it reads; its groups (ports,
feature store, events, runtime, serving, benchmarks, hooks) are nested settings classes. A
pipeline's own variables are a settings class in the pipeline's module, named by its
``Pipeline.settings`` and loaded with :func:`load_group`.

Each value comes from the first of these that has it (``cascade config`` shows which):

1. ``environment``: the ``CASCADE_*`` variable;
2. ``file``: the same name as a key of ``$CASCADE_HOME/cascade.toml`` (``CASCADE_X = value``);
3. ``profile``: the ``cluster`` profile's value (``CASCADE_PROFILE=cluster`` points the code at
   shared services);
4. ``default``: the field's default.

An unknown ``CASCADE_*`` name in the environment or the file gets one warning per process naming
the closest known variable.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tomllib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.dataclasses import dataclass

from cascade.settings_fields import (
    SETTINGS_CONFIG,
    Flag,
    Names,
    Seeds,
    SettingField,
    Sizes,
    comma_list,
    setting,
    setting_fields,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("local", "cluster")
PORT_NAMES = (
    "broker",
    "broker_controller",
    "broker_2",
    "broker_2_controller",
    "broker_3",
    "broker_3_controller",
    "airflow",
    "mlflow",
    "serving",
    "asr_serving",
    "postgres",
    "redis",
    "spark",
    "spark_ui",
)
"""Fields of :class:`Ports`; each is overridden by ``CASCADE_{NAME}_PORT``."""
SETTINGS_FILE = "cascade.toml"
"""Settings file in ``$CASCADE_HOME`` (flat ``CASCADE_X = value`` keys)."""

SOURCES = ("default", "profile", "file", "environment")

_PROFILE_VALUES: dict[str, dict[str, str]] = {
    "local": {},
    # The cluster stack on this machine: its own Spark standalone master, PostgreSQL, Redis and
    # Celery workers, training on two node ranks of one process each, servers behind a token.
    # A real cluster names its hosts in the same variables (infra/k8s/namespace.yaml does).
    "cluster": {
        "CASCADE_SPARK_MASTER": "stack",
        "CASCADE_TRAIN_PROCESSES": "1",
        "CASCADE_TRAIN_NODES": "2",
        "CASCADE_SERVING_AUTH": "1",
    },
}
"""Per profile: variables whose value differs from the field default."""


T = TypeVar("T")


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class Ports:
    """TCP ports of the local stack; every service binds to 127.0.0.1."""

    env_pattern: ClassVar[str] = "CASCADE_{}_PORT"
    title: ClassVar[str] = "Ports"

    broker: int = Field(default=19092, ge=1024, le=65535)
    """Apache Kafka: the (first) node's client listener."""
    broker_controller: int = Field(default=19093, ge=1024, le=65535)
    """Apache Kafka: the (first) node's KRaft controller listener."""
    broker_2: int = Field(default=19094, ge=1024, le=65535)
    """Apache Kafka, ``cluster`` profile: the second node's client listener."""
    broker_2_controller: int = Field(default=19095, ge=1024, le=65535)
    """Apache Kafka, ``cluster`` profile: the second node's controller listener."""
    broker_3: int = Field(default=19096, ge=1024, le=65535)
    """Apache Kafka, ``cluster`` profile: the third node's client listener."""
    broker_3_controller: int = Field(default=19097, ge=1024, le=65535)
    """Apache Kafka, ``cluster`` profile: the third node's controller listener."""
    airflow: int = Field(default=28080, ge=1024, le=65535)
    """Airflow API server and UI."""
    mlflow: int = Field(default=25000, ge=1024, le=65535)
    """MLflow tracking server and registry."""
    serving: int = Field(default=28081, ge=1024, le=65535)
    """KServe model server (Open Inference Protocol v2 over HTTP)."""
    asr_serving: int = Field(default=28082, ge=1024, le=65535)
    """The ASR model's KServe server (its own process, like its own InferenceService)."""
    postgres: int = Field(default=25432, ge=1024, le=65535)
    """PostgreSQL of the cluster stack (event ledger, Feast registry)."""
    redis: int = Field(default=26379, ge=1024, le=65535)
    """Redis of the cluster stack (Feast's online store)."""
    spark: int = Field(default=27077, ge=1024, le=65535)
    """Spark standalone master of the cluster stack (``spark://``)."""
    spark_ui: int = Field(default=28090, ge=1024, le=65535)
    """Web UI and JSON status (``/json/``) of the cluster stack's Spark master."""

    def __post_init__(self) -> None:
        values = [getattr(self, name) for name in PORT_NAMES]
        if len(set(values)) != len(values):
            raise ValueError(
                f"ports must differ, got {dict(zip(PORT_NAMES, values, strict=True))}; "
                "set CASCADE_{NAME}_PORT"
            )


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class FeatureStoreSettings:
    """Feast's shared stores in the ``cluster`` profile (``features/profiles/cluster``)."""

    env_pattern: ClassVar[str] = "CASCADE_{}"
    title: ClassVar[str] = "Feature store (cluster profile)"

    redis: str = setting("", secret=True)
    """Redis online store connection string (``host:port,password=...``, may carry a
    password); empty: the cluster stack's own Redis."""
    feast_registry_url: str = setting("", secret=True)
    """SQL registry URL of Feast (may carry a password); empty: the ``feast`` database of the
    cluster stack's own PostgreSQL."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class EventSettings:
    """How an event-started run gathers the events it works on (``cascade.events``)."""

    env_pattern: ClassVar[str] = "CASCADE_COALESCE_{}"
    title: ClassVar[str] = "Events and coalescing"

    window_s: float = Field(default=15.0, ge=0)
    """A run starts work once the asset has had no new event for this many seconds."""
    max_wait_s: float = Field(default=300.0, ge=0)
    """Upper bound on that wait in seconds, so an endless trickle still gets processed."""
    max_releases: int = Field(default=3, ge=1)
    """How many failed runs may give an event back for a later run to retry; the next claim
    dead-letters it with the last run's id instead."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class RuntimeSettings:
    """Training runtime and process memory."""

    env_pattern: ClassVar[str] = "CASCADE_{}"
    title: ClassVar[str] = "Training runtime"

    preranking_checkpoint_every: int | None = Field(default=None, ge=1)
    """Checkpoint interval in steps of the FSCD pre-ranker's phases (unset: the config's)."""
    retry_delay_s: float | None = Field(default=None, ge=0)
    """Every pipeline's first retry delay in seconds, instead of each pipeline's own (later
    retries still double it); for development stacks and tests that kill tasks on purpose."""
    keep_freed_memory: Flag = True
    """Keep freed heap memory in the process (glibc mmap/trim thresholds, ``serving.allocator``);
    ``0`` turns it off."""
    run_pipeline: str = ""
    """Set by the step runner while a step runs, for the processes it starts: the pipeline
    (MLflow runs are named and tagged with it)."""
    run_step: str = ""
    """Set by the step runner while a step runs: the step's name."""
    run_ds: str = ""
    """Set by the step runner while a step runs: the partition date."""
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    """Progress of long work (training epochs, materialization, corpus builds, benchmarks):
    ``auto`` draws a bar on a terminal and prints one line now and then otherwise (task logs);
    ``bar``, ``lines`` or ``off`` force one."""
    progress_every_s: float = Field(default=30.0, gt=0)
    """Without a terminal: the most seconds between two progress lines (there is also one
    every 10%)."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class ServingSettings:
    """The model servers (``serving/``)."""

    env_pattern: ClassVar[str] = "CASCADE_SERVING_{}"
    title: ClassVar[str] = "Serving"

    poll_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    """Seconds between checks of the registry's champion alias."""
    max_candidates: int = Field(default=10_000, ge=1)
    """Most item ids one pre-ranking request may carry; larger lists get a 400."""
    compiled: Flag = True
    """Score with the gate-passed compiled package when the run has one; ``0``: eager PyTorch."""
    workers: int = Field(default=1, ge=1)
    """Server processes sharing the port."""
    torch_threads: int = Field(default=1, ge=1)
    """Intra-op threads per server process (the compile gate times with the same count)."""
    request_log: bool = False
    """Log a line per request (uvicorn access log and KServe timing)."""
    profile: int = Field(default=0, ge=0)
    """Time the stages of one pre-ranking infer request in this many (wall and CPU) into its
    ``Server-Timing`` response header (``serving.request_profile``): ``0`` none, ``1`` every
    request; ``cascade bench serving`` samples one in eight."""
    max_body_bytes: int = Field(default=1 << 20, ge=1)
    """Largest request body in bytes, counted while it streams (chunked uploads included);
    larger bodies get a 413. The ASR infer route has its own limit (16 MiB)."""
    max_concurrent: int = Field(default=64, ge=1)
    """Requests one server process handles at once; more get a 503 with ``Retry-After: 1``
    (not queued). Health probes are not counted."""
    allowed_hosts: Names = ()
    """Host names a request's ``Host`` may name besides 127.0.0.1, localhost and
    ``CASCADE_HOST`` (others get a 400), written ``a.example,b.example``; ``*`` allows any."""
    auth: Flag = False
    """Require ``Authorization: Bearer`` with ``CASCADE_SERVING_TOKEN`` on every request but the
    health probes (401 without it); on in the ``cluster`` profile."""
    token: str = setting("", secret=True)
    """Bearer token of the model servers; sent by the project's clients whenever it is set."""
    feedback: Flag = setting(True, env="CASCADE_FEEDBACK")
    """Write scored candidates and their features to the lake for the next training."""
    shadow_alias: str | None = setting(None, env="CASCADE_SHADOW_ALIAS")
    """Also score with this registry alias and log both (not ``champion``)."""
    auto_rollback: Flag = setting(False, env="CASCADE_AUTO_ROLLBACK")
    """Roll back on the error-rate policy (``cascade.deployments``)."""
    asr_model_dir: Path | None = setting(None, env="CASCADE_ASR_MODEL_DIR")
    """Folder with ``asr_model.pt`` for ``cascade asr serve`` (the ``--model-dir`` default)."""
    load_generator_loop: Literal["uvloop", "asyncio"] = setting(
        "uvloop", env="CASCADE_LOAD_GENERATOR_LOOP"
    )
    """Event loop of the load generator."""

    def auth_headers(self) -> dict[str, str]:
        """The ``Authorization`` header the model servers want; none without a token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __post_init__(self) -> None:
        if self.shadow_alias == "champion":
            raise ValueError("CASCADE_SHADOW_ALIAS must name another alias than champion")


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class BenchSettings:
    """Inputs of ``cascade bench`` (each also a command-line option there)."""

    env_pattern: ClassVar[str] = "CASCADE_BENCH_{}"
    title: ClassVar[str] = "Benchmarks"

    repeats: int | None = Field(default=None, ge=1)
    """Timed repeats behind each figure, for every benchmark that times repeats (``--repeats``;
    unset: each benchmark's own default, fewer with ``--quick``)."""
    ctr_sizes: Sizes | None = None
    """Impression counts of ``bench ctr`` (unset: its quick or full sizes)."""
    ctr_repeats: int | None = Field(default=None, ge=1)
    """Timed runs per size of ``bench ctr``, the Spark job and its DuckDB peer alternating
    (unset: 3 up to 1M impressions, else 1; 1 with ``--quick``)."""
    preranking_config: str = "ml100k"
    """Training config of ``bench preranking``."""
    preranking_seeds: Seeds = (0,)
    """Seeds of ``bench preranking`` (``0,1,2``)."""
    keep: Path | None = None
    """Folder where ``bench preranking`` keeps each training (``--keep``): a later run at the same
    commit from a clean tree reuses those with the same inputs, so a run cut short resumes
    (:mod:`benchmarks.kept_trainings`); unset: nothing is kept."""
    compile_model: Literal["preranking", "asr"] = "preranking"
    """Model of ``bench compile``."""
    asr_model: Path | None = None
    """Trained ASR model folder of ``bench asr`` and ``bench compile --model asr`` (unset: train
    one)."""
    asr_config: str | None = None
    """Training config ``bench asr`` trains when no model is given (unset: ``fast`` with
    ``--quick``, else ``synthetic``)."""
    asr_sizes: Sizes | None = None
    """Utterance counts of ``bench asr`` (unset: its quick or full sizes)."""
    asr_unique: int = Field(default=2_000, ge=1)
    """Most distinct utterances of a ``bench asr`` landing batch; larger batches repeat them."""
    asr_threads: int = Field(default=2, ge=1)
    """Intra-op threads of ``bench asr``."""
    asr_skip: Annotated[
        tuple[Literal["compile", "people", "recordings"], ...], BeforeValidator(comma_list)
    ] = ()
    """Parts ``bench asr`` leaves out (smoke runs): ``compile`` (the AOTInductor packages, ONNX
    Runtime and Inductor), ``people`` (the Tux Paint corpus), ``recordings`` (the recorded
    speech of the Debian package sources); the JSON names them."""
    asr_clips: int | None = Field(default=None, ge=1)
    """Clips per recorded-speech source of ``bench asr`` (unset: a few with ``--quick``, else
    all of them)."""
    events: int = Field(default=1_000, ge=1)
    """Events ``bench events`` produces."""
    event_partitions: int = Field(default=1, ge=1)
    """Partitions the events of a ``bench events`` burst name (``--partitions``): each is built by
    its own run."""
    multimodal_config: str = "base"
    """Training config of ``bench multimodal``."""
    multimodal_corpus: Path | None = None
    """Corpus folder of ``bench multimodal`` (unset: generate one)."""
    multimodal_corpus_result: Path | None = None
    """A ``bench multimodal-corpus`` result JSON whose figures ``bench multimodal`` reports."""
    multimodal_sizes: Sizes | None = None
    """Pair counts of ``bench multimodal-corpus`` (unset: its quick or full sizes)."""
    multimodal_skip: Annotated[tuple[Literal["corpus"], ...], BeforeValidator(comma_list)] = ()
    """Parts ``bench multimodal`` leaves out (smoke runs): ``corpus`` (the corpus job's
    benchmark, which ``bench multimodal-corpus`` runs on its own); the JSON names them."""
    serving_model: Literal["fscd", "cold"] | None = None
    """Model ``bench serving`` serves (unset: ``fscd``, what the pipeline trains); ``cold``:
    the FSCD pre-ranker's network over every field, trained in process in seconds (no
    selection, no compile step)."""
    serving_cross_features: bool = True
    """Whether the model ``bench serving`` serves reads the engine's statistics from the online
    store (``--no-cross-features``: the id fields only)."""
    serving_candidates: int = Field(default=1_000, ge=1)
    """Candidates per ``bench serving`` request."""
    serving_clients: int = Field(default=8, ge=1)
    """Concurrent ``bench serving`` clients."""
    serving_seconds: int | None = Field(default=None, ge=1)
    """Measured window of ``bench serving`` in seconds (unset: 30, or 3 with ``--quick``)."""
    serving_workers: int = Field(default=2, ge=1)
    """Server processes of ``bench serving``."""
    serving_config: str | None = None
    """Training config of the network ``bench serving`` serves (unset: the pipeline's,
    ``CASCADE_PRERANKING_CONFIG`` or the model's default; ``debug`` with ``--quick``)."""
    serving_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Open-loop arrival rate of ``bench serving`` in requests/s (unset: 70% of the closed
    loop's measured throughput)."""


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class HookSettings:
    """Test and fault-injection hooks: unset in normal runs."""

    env_pattern: ClassVar[str] = "CASCADE_{}"
    title: ClassVar[str] = "Test and fault-injection hooks"

    crash_at: str | None = setting(
        None, hook=True, pattern=r"^[^:]+:\d+$", shape="PHASE:STEP, e.g. train:25"
    )
    """Fault injection: a trainer kills rank 0 after ``PHASE:STEP`` (e.g. ``train:25``) once, so
    the retry's resume from the last checkpoint can be tested."""
    crash_node: int | None = setting(None, hook=True, ge=0)
    """Fault injection, with ``CASCADE_CRASH_AT``: at that point node rank N dies instead of rank
    0 alone (its launcher and every worker of it SIGKILLed at once, as a lost host)."""
    test_champion_file: Path | None = setting(None, hook=True)
    """Test hook: the JSON file the fake model server (``tests/serving``) serves as champion."""


def _default_home() -> Path:
    return REPO_ROOT / ".cascade"


@dataclass(kw_only=True, frozen=True, config=SETTINGS_CONFIG)
class Settings:
    """Everything a component needs to find the others."""

    env_pattern: ClassVar[str] = "CASCADE_{}"
    title: ClassVar[str] = "Stack and paths"

    profile: Literal["local", "cluster"] = "local"
    """``local`` (embedded, one machine) or ``cluster`` (shared services)."""
    home: Path = setting(default_factory=_default_home)
    """State folder: lake, logs, pids, Airflow home, MLflow store, Feast registry (git-ignored)."""
    host: str = "127.0.0.1"
    """Interface every local service binds to."""
    ports: Ports = Field(default_factory=lambda: Ports())
    """Ports of the local stack."""
    kafka_bootstrap: str = ""
    """Kafka bootstrap servers (``host:port,...``) of an external cluster; empty: the stack's
    own Apache Kafka (one node, or three in the ``cluster`` profile), which `cascade up` then
    starts. When set, `cascade up` starts no broker."""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How clients talk to an external Kafka (librdkafka's ``security.protocol``)."""
    kafka_sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = ""
    """SASL mechanism for an external Kafka (with a ``SASL_*`` protocol)."""
    kafka_sasl_username: str = ""
    """SASL user name for an external Kafka."""
    kafka_sasl_password: str = setting("", secret=True)
    """SASL password for an external Kafka."""
    broker_heap_mb: int = Field(default=384, ge=128, le=65536)
    """JVM heap (MB) of each of the stack's own Apache Kafka nodes."""
    kafka_ssl_ca: str = ""
    """CA certificate file (PEM) that an external Kafka's TLS certificate must chain to; empty:
    the system's trust store."""
    mlflow_tracking_uri: str = setting("", env="CASCADE_MLFLOW_URI")
    """MLflow tracking URI; empty means the local tracking server."""
    postgres_url: str = setting("", secret=True)
    """PostgreSQL URL of the event ledger in the ``cluster`` profile
    (``postgresql://user:password@host:port/db``); empty: the ``cascade`` database of the
    cluster stack's own PostgreSQL (``cascade.data_services``)."""
    spark_master: str = "local[2]"
    """Spark master URL; ``stack``: the cluster stack's own standalone master
    (``spark://HOST:CASCADE_SPARK_PORT``, started by `cascade up` in the ``cluster`` profile)."""
    spark_workers: int = Field(default=2, ge=1)
    """Workers of the cluster stack's Spark standalone master."""
    spark_worker_cores: int = Field(default=1, ge=1)
    """Cores each standalone worker offers (its executors' cores)."""
    spark_worker_memory: str = Field(default="2g", pattern=r"^\d+[kmgt]?$")
    """Memory each standalone worker offers its executors."""
    spark_driver_memory: str = "3g"
    """Driver memory of the local Spark sessions of the corpus jobs."""
    airflow_parallelism: int = Field(default=2, ge=1)
    """Airflow core parallelism (low on a 2-core machine)."""
    airflow_heavy_slots: int | None = Field(default=None, ge=1)
    """Slots of the Airflow pool ``cascade_heavy`` (Spark jobs, trainings, compiles: the steps
    a spec marks heavy), created by `cascade up`; empty means the parallelism. Set it below the
    parallelism (1 on a small machine) so light tasks keep running beside one heavy one."""
    airflow_schedules: Flag = True
    """Run the pipelines on their cron schedules; ``0`` leaves only event-triggered and manual
    runs (a development or test stack that should start no run of its own)."""
    train_processes: int = setting(2, group="Training runtime", ge=1)
    """Training processes per node (gloo on CPU, NCCL on GPU)."""
    train_nodes: int = setting(1, group="Training runtime", ge=1)
    """Training node ranks: one ``torch.distributed.run`` launcher per node rank
    (``--nnodes N --node_rank R``, one static rendezvous), each starting ``train_processes``
    workers. All launchers run on this machine over loopback; their command lines, one per
    host of a real cluster, head the training log. A node that fails ends the others."""
    feature_store: FeatureStoreSettings = Field(default_factory=lambda: FeatureStoreSettings())
    events: EventSettings = Field(default_factory=lambda: EventSettings())
    runtime: RuntimeSettings = Field(default_factory=lambda: RuntimeSettings())
    serving: ServingSettings = Field(default_factory=lambda: ServingSettings())
    bench: BenchSettings = Field(default_factory=lambda: BenchSettings())
    hooks: HookSettings = Field(default_factory=lambda: HookSettings())

    def __post_init__(self) -> None:
        if self.spark_master == "stack":
            object.__setattr__(self, "spark_master", self.stack_spark_master)

    @property
    def stack_spark_master(self) -> str:
        """The cluster stack's own Spark standalone master."""
        return f"spark://{self.host}:{self.ports.spark}"

    @property
    def lake_root(self) -> Path:
        return self.home / "lake"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def bootstrap_servers(self) -> str:
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        ports = [self.ports.broker]
        if self.profile == "cluster":
            ports += [self.ports.broker_2, self.ports.broker_3]
        return ",".join(f"{self.host}:{port}" for port in ports)

    @property
    def local_broker(self) -> bool:
        """Whether the stack runs its own Kafka (no external bootstrap servers set)."""
        return not self.kafka_bootstrap

    @property
    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka settings every Kafka client of the platform starts from: the bootstrap
        servers and, for an external cluster, its security settings."""
        config = {"bootstrap.servers": self.bootstrap_servers}
        if self.kafka_security_protocol != "PLAINTEXT":
            config["security.protocol"] = self.kafka_security_protocol
        if self.kafka_security_protocol.startswith("SASL"):
            if not (self.kafka_sasl_mechanism and self.kafka_sasl_username):
                raise ValueError(
                    f"CASCADE_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs "
                    "CASCADE_KAFKA_SASL_MECHANISM and CASCADE_KAFKA_SASL_USERNAME (and "
                    "CASCADE_KAFKA_SASL_PASSWORD)"
                )
            config["sasl.mechanism"] = self.kafka_sasl_mechanism
            config["sasl.username"] = self.kafka_sasl_username
            config["sasl.password"] = self.kafka_sasl_password
        if self.kafka_ssl_ca and self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            config["ssl.ca.location"] = self.kafka_ssl_ca
        return config

    @property
    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"http://{self.host}:{self.ports.mlflow}"

    @property
    def airflow_url(self) -> str:
        return f"http://{self.host}:{self.ports.airflow}"

    @property
    def serving_url(self) -> str:
        return f"http://{self.host}:{self.ports.serving}"

    @property
    def asr_serving_url(self) -> str:
        return f"http://{self.host}:{self.ports.asr_serving}"


class SettingsError(ValueError):
    """A ``CASCADE_*`` value that does not fit its field; the message names the variable."""


class UnknownSettingWarning(UserWarning):
    """A ``CASCADE_*`` name that is no setting (a typo, or a variable that was removed)."""


def pipeline_settings_classes() -> dict[str, type]:
    """Pipeline name -> its settings class, for the registered pipelines that have one."""
    from cascade.pipeline_registry import registered_pipelines

    return {
        name: spec.settings
        for name, spec in registered_pipelines().items()
        if spec.settings is not None
    }


def all_setting_fields(*, pipelines: bool = True) -> list[SettingField]:
    """The kernel's variables, then each registered pipeline's."""
    found = setting_fields(Settings)
    if pipelines:
        seen: set[type] = set()
        for cls in pipeline_settings_classes().values():
            if cls not in seen:
                seen.add(cls)
                found.extend(setting_fields(cls))
    return found


def settings_file(env: Mapping[str, str]) -> Path:
    home = env.get("CASCADE_HOME")
    return (Path(home) if home else _default_home()) / SETTINGS_FILE


def _file_values(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML: {exc}; fix or remove it") from None
    bad = [key for key, value in data.items() if isinstance(value, dict | list)]
    if bad:
        raise SettingsError(
            f"{path}: {bad} must be plain values (CASCADE_X = value), not tables or lists"
        )
    return data


def raw_values(env: Mapping[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """Variable -> (raw value, source) for every variable set anywhere but the defaults."""
    env = os.environ if env is None else env
    path = settings_file(env)
    from_file = _file_values(path)
    found: dict[str, tuple[Any, str]] = {}
    profile = env.get("CASCADE_PROFILE") or str(from_file.get("CASCADE_PROFILE") or "local")
    for name, value in _PROFILE_VALUES.get(profile, {}).items():
        found[name] = (value, "profile")
    for name, value in from_file.items():
        found[name] = (value, "file")
    for name, value in env.items():
        if name.startswith("CASCADE_"):
            found[name] = (value, "environment")
    return found


def _nested_kwargs(
    fields: Sequence[SettingField], raw: Mapping[str, tuple[Any, str]]
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for field in fields:
        if field.env not in raw:
            continue
        value = raw[field.env][0]
        if value == "" and field.annotation is not str:
            continue  # an empty non-text variable means unset
        if field.env == "CASCADE_HOME":
            value = Path(value).resolve()
        target = kwargs
        for part in field.path[:-1]:
            target = target.setdefault(part, {})
        target[field.path[-1]] = value
    return kwargs


_RULES = {
    "greater_than_equal": ">= {ge}",
    "greater_than": "> {gt}",
    "less_than": "< {lt}",
    "less_than_equal": "<= {le}",
    "literal_error": "one of {expected}",
    "string_pattern_mismatch": "of the form {pattern}",
    "too_short": "at least {min_length} long",
    "too_long": "at most {max_length} long",
}


def _describe(value: Any) -> str:
    return str(value) if isinstance(value, str) and value.strip() else repr(value)


def _explain(
    error: Mapping[str, Any],
    fields: Sequence[SettingField],
    raw: Mapping[str, tuple[Any, str]],
    path_file: Path,
) -> str:
    loc = tuple(part for part in error["loc"] if isinstance(part, str))
    field = next((f for f in fields if loc[: len(f.path)] == f.path), None)
    kind = str(error["type"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if field is None:  # a check across fields (``__post_init__``) names its variables itself
        return message
    if kind == "string_pattern_mismatch" and field.shape:
        need = f"must be {field.shape}"
    elif kind in _RULES:
        need = "must be " + _RULES[kind].format(**error.get("ctx", {}))
    elif kind.startswith("int_"):
        need = "must be an integer"
    elif kind.startswith("float_") or kind == "finite_number":
        need = "must be a finite number"
    elif kind == "value_error":
        need = message
    else:
        need = f"is invalid ({message})"
    given, source = raw.get(field.env, (error.get("input"), "default"))
    where = {"file": f" (set in {path_file})", "profile": " (the profile's value)"}.get(source, "")
    fix = "fix it or unset it"
    if field.default is not None:
        fix += f" for the default ({_describe(field.default)})"
    return f"{field.env} {need}, got {_describe(given)}{where}; {fix}"


def _build(cls: type, fields: Sequence[SettingField], env: Mapping[str, str] | None) -> Any:
    env = os.environ if env is None else env
    raw = raw_values(env)
    try:
        return cls(**_nested_kwargs(fields, raw))
    except ValidationError as exc:
        reasons = [_explain(e, fields, raw, settings_file(env)) for e in exc.errors()]
        raise SettingsError("; ".join(dict.fromkeys(reasons))) from None


_warned: set[str] = set()
_checking = False


def _warn_unknown(env: Mapping[str, str] | None) -> None:
    """One warning per unknown name per process, with the closest known variable."""
    global _checking
    if _checking:  # a pipeline module being imported by the registry loads settings
        return
    raw = raw_values(env)
    kernel = {field.env for field in setting_fields(Settings)}
    unknown = sorted(name for name in raw if name not in kernel and name not in _warned)
    if not unknown:
        return
    _checking = True
    try:
        known = {field.env for field in all_setting_fields()}
    finally:
        _checking = False
    for name in unknown:
        if name in known:
            continue
        _warned.add(name)
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(
            f"{name} is not a Cascade setting{hint} (`cascade config` lists them)",
            UnknownSettingWarning,
            stacklevel=3,
        )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The active settings from ``env`` (default: the process environment), the settings file,
    the profile and the defaults; :class:`SettingsError` names a bad variable and the fix."""
    settings: Settings = _build(Settings, setting_fields(Settings), env)
    _warn_unknown(env)
    return settings


def load_group(cls: type[T], env: Mapping[str, str] | None = None) -> T:
    """A pipeline's settings class (or any settings class) loaded like :func:`load_settings`."""
    return _build(cls, setting_fields(cls), env)  # type: ignore[no-any-return]


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment (children started inside inherit them)
    for the block, then restore each variable's previous value or absence."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
