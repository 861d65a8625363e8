"""Typed configuration and the two profiles.

``local`` (the default) runs everything embedded on one machine; ``cluster`` points the same
code at shared services. A profile is chosen by ``CASCADE_PROFILE``; individual fields are
overridden by ``CASCADE_*`` environment variables (see :func:`load_settings`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("local", "cluster")
PROMOTION_METRICS = {"auc": True, "logloss": False}
"""Metrics the champion/challenger gate can compare -> whether higher is better."""
PRERANKING_MODELS = ("fscd", "mlp")
"""What the ``ctr_preranking`` train step trains (``Settings.preranking_model``)."""


PORT_NAMES = ("broker", "airflow", "mlflow", "serving", "asr_serving")
"""Fields of :class:`Ports`; each is overridden by ``CASCADE_{NAME}_PORT``."""


@dataclass(kw_only=True, frozen=True)
class Ports:
    """TCP ports of the local stack; every service binds to 127.0.0.1."""

    broker: int = 19092
    """Kafka-protocol broker."""
    airflow: int = 28080
    """Airflow API server and UI."""
    mlflow: int = 25000
    """MLflow tracking server and registry."""
    serving: int = 28081
    """KServe model server (Open Inference Protocol v2 over HTTP)."""
    asr_serving: int = 28082
    """The ASR model's KServe server (its own process, like its own InferenceService)."""

    def __post_init__(self) -> None:
        for name in PORT_NAMES:
            port = getattr(self, name)
            if not 1024 <= port <= 65535:
                raise ValueError(
                    f"port {name}={port} is outside 1024..65535; set CASCADE_{name.upper()}_PORT"
                )
        values = [getattr(self, name) for name in PORT_NAMES]
        if len(set(values)) != len(values):
            raise ValueError(f"ports must differ, got {values}")


@dataclass(kw_only=True, frozen=True)
class Settings:
    """Everything a component needs to find the others."""

    profile: str = "local"
    """``local`` (embedded, one machine) or ``cluster``."""
    home: Path = field(default_factory=lambda: REPO_ROOT / ".cascade")
    """State folder: lake, logs, pids, Airflow home, MLflow store, Feast registry (git-ignored)."""
    host: str = "127.0.0.1"
    """Interface every local service binds to."""
    ports: Ports = field(default_factory=Ports)
    """Ports of the local stack."""
    kafka_bootstrap: str = ""
    """Kafka bootstrap servers; empty means the local broker."""
    mlflow_tracking_uri: str = ""
    """MLflow tracking URI; empty means the local tracking server."""
    spark_master: str = "local[2]"
    """Spark master URL."""
    train_processes: int = 2
    """Training processes per node (gloo on CPU, NCCL on GPU)."""
    registered_model: str = "preranking"
    """Name of the pre-ranking model in the MLflow registry."""
    promotion_tolerance: float = 0.005
    """The champion alias moves only if the challenger is at most this much worse than the
    champion on ``promotion_metric``, both measured on the same held-out rows."""
    promotion_metric: str = "auc"
    """``auc`` (higher is better) or ``logloss`` (lower is better): what the gate compares."""
    airflow_parallelism: int = 2
    """Airflow core parallelism (low on a 2-core machine)."""
    preranking_model: str = "fscd"
    """What the ``ctr_preranking`` train step trains (``CASCADE_PRERANKING_MODEL``): ``fscd``,
    the ranking cascade whose FSCD-selected ColdPreRanker is deployed
    (``models.preranking.cascade_train``), or ``mlp``, the dense-feature PreRanker
    (``models.preranking.train``), which the compile step can package with AOTInductor."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(
                f"unknown profile {self.profile!r}; choose one of {PROFILES} (CASCADE_PROFILE)"
            )
        if self.train_processes < 1:
            raise ValueError("train_processes must be >= 1")
        if not 0 <= self.promotion_tolerance < 1:
            raise ValueError("promotion_tolerance must be in [0, 1)")
        if self.preranking_model not in PRERANKING_MODELS:
            raise ValueError(
                f"unknown preranking_model {self.preranking_model!r}; choose one of "
                f"{PRERANKING_MODELS} (CASCADE_PRERANKING_MODEL)"
            )
        if self.promotion_metric not in PROMOTION_METRICS:
            raise ValueError(
                f"unknown promotion_metric {self.promotion_metric!r}; choose one of "
                f"{sorted(PROMOTION_METRICS)} (CASCADE_PROMOTION_METRIC)"
            )

    @property
    def lake_root(self) -> Path:
        return self.home / "lake"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or f"{self.host}:{self.ports.broker}"

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


def local_profile() -> Settings:
    return Settings(profile="local")


def cluster_profile() -> Settings:
    return Settings(
        profile="cluster",
        kafka_bootstrap="kafka.cascade.svc:9092",
        mlflow_tracking_uri="http://mlflow.cascade.svc:5000",
        spark_master="k8s://https://kubernetes.default.svc",
        train_processes=8,
    )


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """The active settings: the profile from ``CASCADE_PROFILE``, then ``CASCADE_*`` overrides."""
    env = dict(os.environ if env is None else env)
    profile = env.get("CASCADE_PROFILE", "local")
    if profile not in PROFILES:
        raise ValueError(f"CASCADE_PROFILE={profile!r} is not a profile; choose one of {PROFILES}")
    base = local_profile() if profile == "local" else cluster_profile()
    ports = Ports(
        **{
            name: int(env[f"CASCADE_{name.upper()}_PORT"])
            for name in PORT_NAMES
            if f"CASCADE_{name.upper()}_PORT" in env
        }
    )
    overrides: dict[str, object] = {"ports": ports}
    if "CASCADE_HOME" in env:
        overrides["home"] = Path(env["CASCADE_HOME"]).resolve()
    if "CASCADE_KAFKA_BOOTSTRAP" in env:
        overrides["kafka_bootstrap"] = env["CASCADE_KAFKA_BOOTSTRAP"]
    if "CASCADE_MLFLOW_URI" in env:
        overrides["mlflow_tracking_uri"] = env["CASCADE_MLFLOW_URI"]
    if "CASCADE_SPARK_MASTER" in env:
        overrides["spark_master"] = env["CASCADE_SPARK_MASTER"]
    if "CASCADE_TRAIN_PROCESSES" in env:
        overrides["train_processes"] = int(env["CASCADE_TRAIN_PROCESSES"])
    if "CASCADE_PROMOTION_TOLERANCE" in env:
        overrides["promotion_tolerance"] = float(env["CASCADE_PROMOTION_TOLERANCE"])
    if "CASCADE_PROMOTION_METRIC" in env:
        overrides["promotion_metric"] = env["CASCADE_PROMOTION_METRIC"]
    if "CASCADE_PRERANKING_MODEL" in env:
        overrides["preranking_model"] = env["CASCADE_PRERANKING_MODEL"]
    return replace(base, **overrides)  # type: ignore[arg-type]
