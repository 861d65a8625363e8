"""The cluster profile's deployment manifests (``infra/k8s/``): made from the specs, and checked
offline.

    cascade manifests            # validate every manifest; exit 1 naming each error
    cascade manifests --write    # regenerate the files made from the specs, then validate

Two files are made here, the way ``dvc.yaml`` is made from the pipeline specs:
``spark-applications.yaml`` (one spark-operator ``SparkApplication`` per step declared
``spark=True``; the driver runs ``cascade step STEP --pipeline P --ds {{ ds }}``, the function
the Airflow task and the DVC stage call) and ``kafka-topics.yaml`` (one Strimzi ``KafkaTopic``
per topic of :data:`cascade.assets.TOPICS`). The rest (Airflow Helm values, KServe
``InferenceService``\\ s, Redis, MLflow) is written by hand.

Validation never reaches the network. Kubernetes kinds are checked by ``kubernetes-validate``
against the OpenAPI schemas it ships (strict: an unknown field is an error). Custom resources
are checked with ``jsonschema`` against ``infra/k8s/schemas/<kind>.json``: the fields of each
CRD's ``openAPIV3Schema`` that these manifests use, written down from the operator's API
(types, enums, required fields; unknown fields refused), whose pod parts (containers, env,
resources) refer to the same Kubernetes definitions. The Airflow chart's values are checked
against ``airflow-values.json``, the part of the chart's ``values.schema.json`` they set.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from cascade.assets import TOPIC_DEAD_LETTER, TOPICS
from cascade.config import REPO_ROOT
from cascade.pipeline_spec import Pipeline

K8S_DIR = REPO_ROOT / "infra" / "k8s"
SCHEMA_DIR = K8S_DIR / "schemas"
KUBERNETES_VERSION = "1.33"
"""The Kubernetes API version the manifests are checked against."""
NAMESPACE = "cascade"
IMAGE = "ghcr.io/cascade-ml/cascade:0.1.0"
"""The project's image: the repository installed from ``infra/requirements.lock`` under
``/opt/cascade`` (DAGs, jobs, models, serving); override the tag per release."""
SPARK_VERSION = "4.3.0"
"""Spark of the image (the ``pyspark`` pin)."""
KAFKA_CLUSTER = "cascade"
"""The Strimzi ``Kafka`` resource the topics belong to (``kafka.cascade.svc:9092``)."""
SPARK_APPLICATIONS = "spark-applications.yaml"
TASK_SECRETS = "cascade-task-secrets"
"""The Secret every task's pod reads (Airflow's and the Spark steps'): the MLflow writer's
credential, the online-store writer's Redis URL, the Feast registry's own database role. The
model servers read ``cascade-serving-secrets`` (the reader's); the promoter's credential is
mounted only where the promotion step runs (docs/operations/security.md)."""
KAFKA_TOPICS = "kafka-topics.yaml"
AIRFLOW_VALUES = "airflow-values.yaml"
HEADER = """\
# Generated from {source} by `cascade manifests --write`;
# do not edit by hand.
"""
CUSTOM_KINDS = {
    ("sparkoperator.k8s.io/v1beta2", "SparkApplication"): "sparkapplication.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.json",
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): "kafkatopic.json",
}
"""(apiVersion, kind) -> the schema file of its CRD fields."""
DEFINITIONS_URI = "https://kubernetes.io/api/_definitions.json"


class ManifestError(ValueError):
    """A manifest does not validate; the message names the file, the object and the field."""


def dns_name(*parts: str) -> str:
    """A Kubernetes object name (DNS-1123 label) from spec names: ``ctr_cross`` -> ``ctr-cross``."""
    name = "-".join(part.replace("_", "-") for part in parts)
    if len(name) > 63:
        raise ValueError(f"object name {name!r} is longer than 63 characters")
    return name


def spark_application(spec: Pipeline, step_name: str) -> dict[str, Any]:
    """The ``SparkApplication`` of one Spark step: the driver runs the step as ``cascade step``;
    retries follow the pipeline's; the event log goes to the lake so each run shows its
    executors in the history server."""
    labels = {
        "app.kubernetes.io/part-of": "cascade",
        "cascade/pipeline": spec.name,
        "cascade/step": step_name,
    }

    def env_from() -> list[dict[str, Any]]:
        return [
            {"configMapRef": {"name": "cascade-settings"}},
            {"secretRef": {"name": TASK_SECRETS}},
        ]

    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "name": dns_name(spec.name, step_name),
            "namespace": NAMESPACE,
            "labels": dict(labels),
        },
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "image": IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": "local:///opt/cascade/infra/spark_step.py",
            # Airflow's SparkKubernetesOperator renders {{ ds }} when it submits the file.
            "arguments": [step_name, "--pipeline", spec.name, "--ds", "{{ ds }}"],
            "sparkVersion": SPARK_VERSION,
            "sparkConf": {
                "spark.sql.session.timeZone": "UTC",
                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": "s3a://cascade-lake/spark-events",
            },
            "restartPolicy": {
                "type": "OnFailure",
                "onFailureRetries": spec.retries,
                "onFailureRetryInterval": int(spec.retry_delay_s),
                "onSubmissionFailureRetries": spec.retries,
                "onSubmissionFailureRetryInterval": int(spec.retry_delay_s),
            },
            "driver": {
                "cores": 1,
                "memory": "4g",
                "serviceAccount": "spark",
                "labels": dict(labels),
                "envFrom": env_from(),
            },
            "executor": {
                "cores": 2,
                "instances": 2,
                "memory": "6g",
                "labels": dict(labels),
                "envFrom": env_from(),
            },
            "dynamicAllocation": {
                "enabled": True,
                "initialExecutors": 2,
                "minExecutors": 1,
                "maxExecutors": 64,
            },
            "timeToLiveSeconds": 86400,
        },
    }


def spark_applications(specs: Iterable[Pipeline]) -> list[dict[str, Any]]:
    """One ``SparkApplication`` per step declared ``spark=True``, in pipeline and step order."""
    return [
        spark_application(spec, step.name)
        for spec in sorted(specs, key=lambda s: s.name)
        for step in spec.steps
        if step.spark
    ]


def kafka_topics() -> list[dict[str, Any]]:
    """One Strimzi ``KafkaTopic`` per Cascade topic: three replicas, two in sync (the producers
    send with acks=all); dead letters are kept a month, events a week."""
    week_ms, month_ms = 7 * 86_400_000, 30 * 86_400_000
    return [
        {
            "apiVersion": "kafka.strimzi.io/v1beta2",
            "kind": "KafkaTopic",
            "metadata": {
                "name": topic,
                "namespace": NAMESPACE,
                "labels": {"strimzi.io/cluster": KAFKA_CLUSTER},
            },
            "spec": {
                "topicName": topic,
                "partitions": 6,
                "replicas": 3,
                "config": {
                    "retention.ms": month_ms if topic == TOPIC_DEAD_LETTER else week_ms,
                    "min.insync.replicas": 2,
                    "cleanup.policy": "delete",
                },
            },
        }
        for topic in TOPICS
    ]


def _documents_text(source: str, documents: list[dict[str, Any]]) -> str:
    body = yaml.safe_dump_all(documents, sort_keys=False, width=100)
    return HEADER.format(source=source) + "---\n" + body


def generated(specs: Iterable[Pipeline]) -> dict[str, str]:
    """File name -> the text made from the specs."""
    return {
        SPARK_APPLICATIONS: _documents_text(
            "the pipeline specs (steps with spark=True)", spark_applications(specs)
        ),
        KAFKA_TOPICS: _documents_text("cascade.assets.TOPICS", kafka_topics()),
    }


def write_generated(specs: Iterable[Pipeline], folder: Path = K8S_DIR) -> list[str]:
    """Write the generated files into ``folder``; returns the names whose content changed."""
    changed = []
    for name, text in generated(specs).items():
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(name)
    return changed


@cache
def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / name).read_text())


@cache
def _registry() -> Any:
    """The Kubernetes definitions that kubernetes-validate ships, for the CRD schemas' pod
    parts (``$ref`` to :data:`DEFINITIONS_URI`)."""
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    version = [v for v in utils.all_versions() if utils.major_minor(v) <= KUBERNETES_VERSION][-1]
    definitions = utils.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", KUBERNETES_VERSION
    )
    return Registry().with_resource(DEFINITIONS_URI, Resource.from_contents(definitions))


def _schema_errors(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}" for e in errors]


def resource_errors(resource: Mapping[str, Any]) -> list[str]:
    """What is wrong with one Kubernetes object (empty: it validates)."""
    if not isinstance(resource, Mapping) or "apiVersion" not in resource or "kind" not in resource:
        return ["(top): not a Kubernetes object (apiVersion and kind are required)"]
    custom = CUSTOM_KINDS.get((resource["apiVersion"], resource["kind"]))
    if custom is not None:
        return _schema_errors(resource, _schema(custom))
    from kubernetes_validate import utils

    try:
        utils.validate(dict(resource), KUBERNETES_VERSION, strict=True)
    except utils.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(top)"
        return [f"{where}: {exc.message}"]
    except utils.SchemaNotFoundError:
        return [f"(top): no schema for {resource['apiVersion']} {resource['kind']}"]
    return []


def airflow_values_errors(values: Any) -> list[str]:
    """What is wrong with the Airflow Helm chart's values (empty: they validate)."""
    return _schema_errors(values, _schema("airflow-values.json"))


def _name(resource: Any) -> str:
    if isinstance(resource, Mapping):
        meta = resource.get("metadata")
        name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
        return f"{resource.get('kind', '?')}/{name}"
    return "?"


def file_errors(path: Path) -> Iterator[str]:
    """``FILE KIND/NAME FIELD: message`` for each error of one manifest file."""
    text = path.read_text()
    if path.name == AIRFLOW_VALUES:
        for error in airflow_values_errors(yaml.safe_load(text)):
            yield f"{path.name} values {error}"
        return
    for resource in yaml.safe_load_all(text):
        if resource is None:
            continue
        for error in resource_errors(resource):
            yield f"{path.name} {_name(resource)} {error}"


def manifest_files(folder: Path = K8S_DIR) -> list[Path]:
    return sorted(folder.glob("*.yaml"))


def all_errors(folder: Path = K8S_DIR) -> list[str]:
    return [error for path in manifest_files(folder) for error in file_errors(path)]


def cmd_manifests(args: argparse.Namespace) -> int:
    from cascade.pipeline_registry import registered_pipelines

    specs = registered_pipelines().values()
    if args.write:
        changed = write_generated(specs)
        print(f"written: {', '.join(changed)}" if changed else "generated files up to date")
    else:
        stale = [
            name
            for name, text in generated(specs).items()
            if not (K8S_DIR / name).is_file() or (K8S_DIR / name).read_text() != text
        ]
        for name in stale:
            print(f"{name}: differs from the specs; run `cascade manifests --write`")
        if stale:
            return 1
    errors = all_errors()
    for error in errors:
        print(error)
    files = len(manifest_files())
    print(f"{files} manifest files, {len(errors)} errors (Kubernetes {KUBERNETES_VERSION})")
    return 1 if errors else 0


def register_command(sub: Any) -> None:
    parser = sub.add_parser(
        "manifests", help="validate the cluster profile's manifests (infra/k8s) offline"
    )
    parser.add_argument(
        "--write", action="store_true", help="regenerate the files made from the specs first"
    )
    parser.set_defaults(func=cmd_manifests)
