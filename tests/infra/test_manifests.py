"""The cluster profile's manifests validate offline, match the specs, and a broken one fails."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.capacity import plan
from cascade.assets import TOPICS
from cascade.pipeline_registry import registered_pipelines
from infra import manifests


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((manifests.K8S_DIR / name).read_text()) if d]


def test_committed_manifests_validate_and_follow_the_specs() -> None:
    specs = registered_pipelines().values()
    for name, text in manifests.generated(specs).items():
        assert (manifests.K8S_DIR / name).read_text() == text, (
            f"{name} differs from the specs; run `cascade manifests --write`"
        )
    assert manifests.all_errors() == []
    spark_steps = {(s.name, step.name) for s in specs for step in s.steps if step.spark}
    apps = documents(manifests.SPARK_APPLICATIONS)
    assert {
        (a["metadata"]["labels"]["cascade/pipeline"], a["spec"]["arguments"][0]) for a in apps
    } == spark_steps
    assert ("ctr_preranking", "training_set") in spark_steps and (
        "ctr_cross",
        "stats",
    ) in spark_steps
    assert {t["spec"]["topicName"] for t in documents(manifests.KAFKA_TOPICS)} == set(TOPICS)
    kinds = {
        d["kind"]
        for path in manifests.manifest_files()
        if path.name != manifests.AIRFLOW_VALUES
        for d in documents(path.name)
    }
    assert {
        "SparkApplication",
        "KafkaTopic",
        "InferenceService",
        "StatefulSet",
        "Deployment",
        "Service",
        "ConfigMap",
        "Namespace",
    } <= kinds
    values = yaml.safe_load((manifests.K8S_DIR / manifests.AIRFLOW_VALUES).read_text())
    assert values["executor"] == "CeleryExecutor" and values["workers"]["replicas"] == 2


def test_replicas_are_the_capacity_plan() -> None:
    services = {d["metadata"]["name"]: d for d in documents("inference-services.yaml")}
    assert set(services) == {"preranking", "asr"}
    assert all(0 < s["spec"]["predictor"]["canaryTrafficPercent"] < 100 for s in services.values())
    computed = plan()
    assert (
        services["preranking"]["spec"]["predictor"]["minReplicas"] == computed["serving_replicas"]
    )
    app = documents(manifests.SPARK_APPLICATIONS)[0]
    assert app["spec"]["dynamicAllocation"]["maxExecutors"] >= computed["spark_executors"]


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value


BROKEN = [
    ("spark-applications.yaml", "spec.executor.instances", "two", "executor.instances"),
    ("spark-applications.yaml", "spec.sparkVersion", KeyError, "sparkVersion"),
    ("spark-applications.yaml", "spec.driver.envFrom.0.configMapRef.nam", "x", "envFrom"),
    ("kafka-topics.yaml", "spec.partitions", KeyError, "partitions"),
    (
        "inference-services.yaml",
        "spec.predictor.containers.0.ports.0.containerPort",
        "8080",
        "containerPort",
    ),
    ("inference-services.yaml", "spec.predictor.canaryTrafficPercent", 150, "canaryTrafficPercent"),
    ("mlflow.yaml", "spec.replicas", "2", "replicas"),
    ("redis.yaml", "spec.selector", KeyError, "selector"),
    ("mlflow.yaml", "spec.template.spec.containers.0.imagePullPolcy", "Always", "imagePullPolcy"),
]


@pytest.mark.parametrize(("name", "path", "value", "named"), BROKEN)
def test_a_broken_manifest_fails(name: str, path: str, value: Any, named: str) -> None:
    docs = documents(name)
    # The last document of the file: a Deployment/StatefulSet where a Service comes first.
    broken = copy.deepcopy(docs[-1])
    _set(broken, path, value)
    errors = manifests.resource_errors(broken)
    assert errors and any(named in e for e in errors), errors
    assert manifests.resource_errors(docs[-1]) == []


def test_broken_airflow_values_fail(tmp_path: Path) -> None:
    values = yaml.safe_load((manifests.K8S_DIR / manifests.AIRFLOW_VALUES).read_text())
    assert manifests.airflow_values_errors(values) == []
    for path, value in (
        ("workers.replicas", "2"),
        ("executor", "CeleryExcutor"),
        ("data.metadataSecretName", KeyError),
    ):
        broken = copy.deepcopy(values)
        _set(broken, path, value)
        if value is KeyError:
            broken["data"]["metadataConnection"] = {"host": "x"}
        assert manifests.airflow_values_errors(broken), path
    folder = tmp_path / "k8s"
    folder.mkdir()
    bad = copy.deepcopy(values)
    bad["workers"]["replicas"] = "2"
    (folder / manifests.AIRFLOW_VALUES).write_text(yaml.safe_dump(bad))
    (folder / "ok.yaml").write_text((manifests.K8S_DIR / "redis.yaml").read_text())
    errors = manifests.all_errors(folder)
    assert len(errors) == 1 and errors[0].startswith("airflow-values.yaml values workers.replicas")


def test_only_the_promotion_worker_mounts_the_promoter_credential_and_the_signing_key() -> None:
    """The chart's workers take the default queue and hold the writer's credential only; the
    promoter's Secret and the signing key's are mounted by one Deployment, whose worker takes the
    promotion queue alone."""
    from cascade.pipeline_spec import DEFAULT_QUEUE, PROMOTION_QUEUE

    promotion_secrets = ("cascade-mlflow-promoter", "cascade-release-signing-key")
    holders = {secret: set() for secret in promotion_secrets}
    for path in manifests.manifest_files():
        text = path.read_text()
        found = [d for d in yaml.safe_load_all(text) if d]
        if path.name == manifests.AIRFLOW_VALUES:
            # The chart's values carry pod parts as text too (extraEnvFrom): search the file.
            named = {"airflow-values": text}
        else:
            named = {f"{d['kind']}/{d['metadata']['name']}": yaml.safe_dump(d) for d in found}
        for name, body in named.items():
            for secret in promotion_secrets:
                if secret in "\n".join(
                    line.split("#")[0] for line in body.splitlines()
                ):  # a comment naming it mounts nothing
                    holders[secret].add(name)
    assert holders == {secret: {"Deployment/airflow-promotion-worker"} for secret in holders}
    (worker,) = documents("airflow-promotion-worker.yaml")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["airflow", "celery", "worker"]
    args = container["args"]
    assert args[args.index("--queues") + 1] == PROMOTION_QUEUE
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/cascade/mlflow/roles/promoter.json" in mounts
    assert "/var/lib/cascade/signing/release.key" in mounts
    values = yaml.safe_load((manifests.K8S_DIR / manifests.AIRFLOW_VALUES).read_text())
    assert values["config"]["operators"]["default_queue"] == DEFAULT_QUEUE
    assert "cascade-task-secrets" in values["extraEnvFrom"]
