"""Load the registered pre-ranking model for serving, evaluation and the registry.

The pipeline and the server load a registered version as data (:func:`load_version`): the
version's files are downloaded, checked against the sha256 digests its registration recorded
(:mod:`cascade.artifacts`), and the network is rebuilt from its state dict
(``torch.load(weights_only=True)``) and JSON config by this module's code.

A trained model is also logged as an MLflow pyfunc "from code" (:func:`log_pyfunc`): the
version holds ``MLmodel``, the code file :mod:`models.preranking.mlflow_model`, a signature and
an input example beside the weights, so people who trust their registry can load it the
standard way (``mlflow.pyfunc.load_model("models:/preranking/N")``, with
``models.preranking`` importable) and nothing is unpickled there either. The pyfunc
(:class:`PreRankingPyfunc`) reads the same files: for the FSCD pre-ranker of the cascade the
folder :func:`save_cold_model` writes (fp32 state dict, run config with the kept fields, field
encoder, the field set as ``fields.json``; a frame of the field columns in), for the
dense-feature network the fp32 ``state_dict`` and the run's :class:`TrainConfig` as JSON (ids +
MODEL_FEATURES in); click probabilities out. Serving uses :func:`load_registered` to get the
plain ``nn.Module`` (and encoder) behind an alias::

    python -c "from models.preranking.inference import load_registered; print(load_registered())"
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import mlflow.artifacts
import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.pyfunc.model import PythonModel, PythonModelContext
from mlflow.tracking import MlflowClient
from torch import nn

from cascade.artifacts import (
    TamperedArtifact,
    folder_digests,
    sha256_file,
    verify,
)
from cascade.config import Settings, load_settings
from cascade.registry import REGISTRY_META, freeze_release, version_by_alias
from cascade.signing import ANY_ROLE, trusted_keys, verified_release
from domains.ctr.schema import MODEL_FEATURES
from models.preranking import REGISTERED_MODEL
from models.preranking.config_registry import CascadeTrainConfig, TrainConfig
from models.preranking.fields import FIELDS_FILE, FieldEncoder, FieldSet
from models.preranking.model import ColdPreRanker, PreRanker

TEST_AUC_TAG = "test_auc"
"""Model-version tag holding the hold-out AUC measured at training time."""

STATE_DICT_ARTIFACT = "state_dict"
CONFIG_ARTIFACT = "train_config"
COLD_DIR_ARTIFACT = "fscd_model"
"""Artifact of :class:`ColdPreRankerPyfunc`: the folder :func:`save_cold_model` writes."""
COLD_STATE_FILE = "state_dict.pt"
COLD_CONFIG_FILE = "cascade_config.json"
"""``{"config": CascadeTrainConfig dict, "fields": [kept fields]}``."""
ENCODER_FILE = "encoder.json"
MODEL_KINDS = ("fscd", "mlp")
"""``fscd``: the FSCD ColdPreRanker (models.preranking.cascade_train), what the pipeline trains;
``mlp``: the PreRanker over dense features, which no pipeline trains any more (a version of one
registered earlier still loads, for the promotion gate's comparisons; the server refuses it).
``result.json`` names it as ``model_kind``."""


def build_model(state_dict: dict[str, torch.Tensor], config: TrainConfig) -> PreRanker:
    """A fp32 PreRanker in eval mode from a (possibly bf16) state dict."""
    model = PreRanker(config.model)
    model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}
    )
    return model.eval()


def load_model_dir(state_dict_path: Path, config_path: Path) -> tuple[PreRanker, TrainConfig]:
    """Rebuild the model from the two files a training run writes."""
    config = TrainConfig.from_dict(json.loads(Path(config_path).read_text()))
    state_dict = torch.load(state_dict_path, map_location="cpu", weights_only=True)
    return build_model(state_dict, config), config


def frame_inputs(frame: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dense, user_id, item_id)`` tensors from a frame with ids and MODEL_FEATURES."""
    missing = [c for c in ("user_id", "item_id", *MODEL_FEATURES) if c not in frame.columns]
    if missing:
        raise ValueError(
            f"pre-ranking input lacks columns {missing}; it needs user_id, item_id and "
            "domains.ctr.schema.MODEL_FEATURES"
        )
    dense = torch.from_numpy(frame[list(MODEL_FEATURES)].to_numpy(dtype=np.float32))
    user = torch.from_numpy(frame["user_id"].to_numpy(dtype=np.int64))
    item = torch.from_numpy(frame["item_id"].to_numpy(dtype=np.int64))
    return dense, user, item


def save_cold_model(
    folder: Path,
    model: ColdPreRanker,
    config: CascadeTrainConfig,
    encoder: FieldEncoder,
) -> Path:
    """Write what serving needs to rebuild an FSCD pre-ranker: the fp32 state dict, the run
    config with the model's fields (the kept ones), the field encoder and the field set it
    encodes (``fields.json``: names, kinds, windows; the column order of the codes)."""
    if tuple(model.field_set) != tuple(encoder.fields):
        raise ValueError(
            f"the model was built on fields {list(model.field_set.names)} but the encoder "
            f"encodes {list(encoder.fields.names)}"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu()
        for k, v in model.state_dict().items()
    }
    torch.save(state, folder / COLD_STATE_FILE)
    (folder / COLD_CONFIG_FILE).write_text(
        json.dumps({"config": config.to_dict(), "fields": list(model.fields)}, indent=2)
    )
    (folder / ENCODER_FILE).write_text(json.dumps(encoder.state()))
    encoder.fields.save(folder)
    return folder


def load_cold_dir(folder: Path) -> tuple[ColdPreRanker, FieldEncoder, CascadeTrainConfig]:
    """Inverse of :func:`save_cold_model`: the model in eval mode, its encoder and config. A
    folder saved before field sets were recorded (no ``fields.json``) reads the default set."""
    folder = Path(folder)
    if not (folder / COLD_CONFIG_FILE).exists():
        raise FileNotFoundError(
            f"{folder} holds no FSCD pre-ranker ({COLD_CONFIG_FILE} missing); the cascade "
            "training (models.preranking.cascade_train) writes it"
        )
    saved = json.loads((folder / COLD_CONFIG_FILE).read_text())
    config = CascadeTrainConfig.from_dict(saved["config"])
    fields = FieldSet.beside(folder)
    encoder = FieldEncoder.from_state(json.loads((folder / ENCODER_FILE).read_text()), fields)
    model = ColdPreRanker(
        config.net, tuple(saved["fields"]), encoder.cardinalities(), field_set=fields
    )
    model.load_state_dict(
        torch.load(folder / COLD_STATE_FILE, map_location="cpu", weights_only=True)
    )
    return model.eval(), encoder, config


@dataclass
class TrainedModel:
    """A training run's model as its output folder holds it (before registration)."""

    model: nn.Module
    """PreRanker or ColdPreRanker, fp32, eval mode."""
    encoder: FieldEncoder | None
    """The field encoder of a ColdPreRanker; None for a PreRanker."""
    test_fraction: float
    """Share of the latest rows the run held out (the registry compares on the same rows)."""


def load_trained(out: Path) -> TrainedModel:
    """The model a finished training run left in ``out`` (its ``result.json`` says which kind)."""
    out = Path(out)
    result = json.loads((out / "result.json").read_text())
    kind = result.get("model_kind", "mlp")
    if kind == "fscd":
        model, encoder, cascade = load_cold_dir(out / COLD_DIR_ARTIFACT)
        return TrainedModel(model=model, encoder=encoder, test_fraction=cascade.test_fraction)
    if kind != "mlp":
        raise ValueError(f"{out}/result.json names model_kind {kind!r}; one of {MODEL_KINDS}")
    network, config = load_model_dir(out / "state_dict.pt", out / "train_config.json")
    return TrainedModel(model=network, encoder=None, test_fraction=config.test_fraction)


@torch.no_grad()
def score_frame(
    model: nn.Module, frame: pd.DataFrame, encoder: FieldEncoder | None = None, batch: int = 65_536
) -> np.ndarray:
    """Click probabilities of either kind of pre-ranker for the rows of a training-set frame
    (a ColdPreRanker reads the fields through ``encoder``, a PreRanker the dense columns)."""
    model.eval()
    if isinstance(model, ColdPreRanker):
        if encoder is None:
            raise ValueError("a ColdPreRanker scores encoded fields; pass its FieldEncoder")
        codes = encoder.encode(frame)
        parts = [model(codes[s : s + batch]) for s in range(0, len(codes), batch)]
    else:
        dense, user, item = frame_inputs(frame)
        parts = [
            model(dense[s : s + batch], user[s : s + batch], item[s : s + batch])
            for s in range(0, len(frame), batch)
        ]
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return torch.sigmoid(torch.cat(parts).float()).numpy()


PYFUNC_CODE = Path(__file__).with_name("mlflow_model.py")
"""The code file MLflow runs to load a logged pre-ranker (models from code: no pickle)."""


def pip_requirements() -> list[str]:
    """What a logged pre-ranker lists (listing them skips MLflow's slow inference of them);
    it also needs this repository's ``models.preranking`` importable where it is loaded."""
    return [f"torch=={torch.__version__.split('+')[0]}", "pandas", "numpy"]


def log_pyfunc(
    name: str,
    artifacts: Mapping[str, str],
    *,
    input_example: pd.DataFrame | None = None,
    signature: Any = None,
) -> Any:
    """Log a pre-ranker's files as an MLflow pyfunc from code into the active run (artifacts:
    :data:`COLD_DIR_ARTIFACT` for an FSCD pre-ranker, :data:`STATE_DICT_ARTIFACT` and
    :data:`CONFIG_ARTIFACT` for a PreRanker); returns MLflow's ``ModelInfo``."""
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=str(PYFUNC_CODE),
        artifacts=dict(artifacts),
        signature=signature,
        input_example=input_example,
        pip_requirements=pip_requirements(),
    )


def log_cold_model(
    folder: Path,
    model: ColdPreRanker,
    config: CascadeTrainConfig,
    encoder: FieldEncoder,
    example: pd.DataFrame,
) -> Any:
    """Save an FSCD pre-ranker's files into ``folder`` (:func:`save_cold_model`) and log them as
    the ``fscd_preranker`` pyfunc of the active run, with ``example`` (raw field columns) as its
    input example and a signature inferred from the model's own scores on it (field columns in,
    one click probability per row out); returns MLflow's ``ModelInfo``."""
    from mlflow.models import infer_signature

    model_dir = save_cold_model(folder, model, config, encoder)
    signature = infer_signature(example, score_frame(model, example, encoder))
    return log_pyfunc(
        "fscd_preranker",
        {COLD_DIR_ARTIFACT: str(model_dir)},
        input_example=example,
        signature=signature,
    )


class PreRankingPyfunc(PythonModel):
    """MLflow pyfunc of either pre-ranker, rebuilt from its state dict and JSON files: a frame
    of the field columns (its ``fields.json``, by default ``models.preranking.fields.FIELD_NAMES``;
    FSCD pre-ranker) or of ids +
    MODEL_FEATURES (PreRanker) in, click probabilities out."""

    model: nn.Module | None = None
    encoder: FieldEncoder | None = None

    def load_context(self, context: PythonModelContext) -> None:
        artifacts = context.artifacts
        if COLD_DIR_ARTIFACT in artifacts:
            self.model, self.encoder, _ = load_cold_dir(Path(artifacts[COLD_DIR_ARTIFACT]))
        elif STATE_DICT_ARTIFACT in artifacts and CONFIG_ARTIFACT in artifacts:
            self.model, _ = load_model_dir(
                Path(artifacts[STATE_DICT_ARTIFACT]), Path(artifacts[CONFIG_ARTIFACT])
            )
        else:
            raise ValueError(
                f"a pre-ranker pyfunc has artifact {COLD_DIR_ARTIFACT!r} or both "
                f"{STATE_DICT_ARTIFACT!r} and {CONFIG_ARTIFACT!r}; this one has {sorted(artifacts)}"
            )

    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("PreRankingPyfunc.predict before load_context; load it via mlflow")
        if self.encoder is not None:
            missing = [c for c in self.encoder.fields.names if c not in model_input.columns]
            if missing:
                raise ValueError(f"pre-ranking input lacks field columns {missing}")
        return score_frame(self.model, model_input, self.encoder)


# Versions logged before the pyfunc moved to code hold a pickled object of one of these names;
# MLflow's loader (where pickles are allowed) finds the class under them.
ColdPreRankerPyfunc = PreRankerPyfunc = PreRankingPyfunc


@dataclass
class LoadedModel:
    """A registered model version, ready to score."""

    model: nn.Module
    """The network (PreRanker or ColdPreRanker), fp32, in eval mode."""
    version: str
    """Registry version number."""
    run_id: str
    """MLflow run that trained it."""
    test_auc: float
    """Hold-out AUC measured at training time."""
    encoder: FieldEncoder | None = None
    """The field encoder a ColdPreRanker reads its inputs through; None for a PreRanker."""
    compiled: Path | None = None
    """The version's AOTInductor package (``compiled/preranking.pt2`` of its run, built and
    passed by the pipeline's compile gate), downloaded; None when there is none."""
    compiled_reason: str = ""
    """Why ``compiled`` is None (empty when it is set)."""


def _client(settings: Settings | None) -> tuple[MlflowClient, Settings]:
    settings = settings or load_settings()
    uri = settings.tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri), settings


def alias_version(settings: Settings | None = None, alias: str = "champion") -> str | None:
    """The version the alias points at, or None when the model or alias does not exist yet."""
    client, settings = _client(settings)
    version = version_by_alias(client, REGISTERED_MODEL, alias)
    return None if version is None else str(version.version)


def version_record(settings: Settings | None, version: str) -> str:
    """The sha256 of version ``version``'s registry record (source, run and tags: the signed
    release and the file digests among them): what a server compares before fetching a
    version it refused again."""
    import hashlib

    client, _ = _client(settings)
    record = client.get_model_version(REGISTERED_MODEL, version)
    blob = json.dumps(
        {"source": record.source, "run_id": record.run_id, "tags": dict(record.tags)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


CROSS_SOURCE_PARAM = "cross_source"
"""Run param of a pre-ranker trained on the cross-statistics engine's training set: the log
source (``jobs.ctr_cross_stats``) the set came from. The server serves no version whose run
lacks it."""


def run_cross_source(settings: Settings | None, run_id: str) -> str | None:
    """The run's :data:`CROSS_SOURCE_PARAM`, None when it has none."""
    client, _ = _client(settings)
    source = client.get_run(run_id).data.params.get(CROSS_SOURCE_PARAM)
    return str(source) if source else None


def load_registered(
    settings: Settings | None = None, alias: str = "champion", *, with_package: bool = False
) -> LoadedModel | None:
    """The model behind ``alias`` (eval mode), or None when nothing is registered there yet;
    ``with_package``: also fetch its compiled package (see :func:`load_version`)."""
    client, settings = _client(settings)
    version = version_by_alias(client, REGISTERED_MODEL, alias)
    if version is None:
        return None
    # Load by number, not alias: the alias may move while we download.
    return load_version(settings, str(version.version), with_package=with_package, role=alias)


COMPILED_DIR = "compiled"
"""Run artifact folder the compile step logs the package and its gate report to."""
COMPILED_PACKAGE = "preranking.pt2"
COMPILED_GATE = "gate.json"


RUN_FILES = "run:"
"""Prefix of the digests of run artifacts (the compiled package) in a version's digest tag."""


def release_parts(settings: Settings, model_uri: str, run_id: str) -> dict[str, str]:
    """What a pre-ranker's version holds, as :func:`cascade.registry.freeze_release` takes it:
    the logged model's files and, when the compile step logged them, the run's compiled package
    and gate report (under :data:`COMPILED_DIR`)."""
    client = _client(settings)[0]
    parts = {"": model_uri}
    names = {a.path for a in client.list_artifacts(run_id, COMPILED_DIR)}
    if f"{COMPILED_DIR}/{COMPILED_PACKAGE}" in names:
        parts[COMPILED_DIR] = f"{client.get_run(run_id).info.artifact_uri}/{COMPILED_DIR}"
    return parts


def registration_files(
    settings: Settings, model_uri: str, run_id: str
) -> tuple[str, dict[str, str]]:
    """What a pre-ranker's registration registers: ``(source, digests)`` of a write-once,
    content-addressed copy (:func:`cascade.registry.freeze_release`) of :func:`release_parts`.
    A re-run of the compile step rewrites the run's ``compiled/``, never a registered
    version's files."""
    return freeze_release(settings, run_id, release_parts(settings, model_uri, run_id))


def registration_digests(settings: Settings, model_uri: str, run_id: str) -> dict[str, str]:
    """The digests of a version registered the way versions were before releases were copied
    (source: the logged model; the run's compiled files prefixed :data:`RUN_FILES`)."""
    client = _client(settings)[0]
    with tempfile.TemporaryDirectory(prefix="cascade-register-") as tmp:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=model_uri, dst_path=tmp, tracking_uri=settings.tracking_uri
            )
        )
        (local / REGISTRY_META).unlink(missing_ok=True)
        digests = folder_digests(local)
        names = {a.path for a in client.list_artifacts(run_id, COMPILED_DIR)}
        for name in (f"{COMPILED_DIR}/{COMPILED_PACKAGE}", f"{COMPILED_DIR}/{COMPILED_GATE}"):
            if name in names:
                path = mlflow.artifacts.download_artifacts(
                    run_id=run_id, artifact_path=name, dst_path=tmp,
                    tracking_uri=settings.tracking_uri,
                )  # fmt: skip
                digests[RUN_FILES + name] = sha256_file(Path(path))
    return digests


def fetch_compiled(
    settings: Settings, run_id: str, cache: Path, expected: Mapping[str, str] | None = None
) -> tuple[Path | None, str]:
    """``(package, "")`` for the compiled package of ``run_id`` when its compile gate passed
    (downloaded once into ``cache/run_id``), else ``(None, reason)``. With ``expected`` (a
    version's recorded digests, see :func:`registration_digests`) the package and its report
    must match them before the package is offered, every time it is offered."""
    client = _client(settings)[0]
    names = {a.path for a in client.list_artifacts(run_id, COMPILED_DIR)}
    package, gate = f"{COMPILED_DIR}/{COMPILED_PACKAGE}", f"{COMPILED_DIR}/{COMPILED_GATE}"
    if package not in names or gate not in names:
        return None, f"run {run_id} has no {package} with {gate} (the compile step did not run)"
    target = Path(cache) / run_id
    if not target.is_dir():
        # Each serving process downloads into its own folder and renames it into place: a
        # killed download is never mistaken for a finished one, and a sibling process that
        # got there first wins.
        partial = Path(cache) / f".{run_id}.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for name in (package, gate):
            mlflow.artifacts.download_artifacts(
                run_id=run_id,
                artifact_path=name,
                dst_path=str(partial),
                tracking_uri=settings.tracking_uri,
            )
        # A file's download lands in dst_path under its own name: partial/preranking.pt2.
        try:
            partial.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(partial, ignore_errors=True)
    if expected is not None:
        wanted = {
            name: expected.get(f"{RUN_FILES}{COMPILED_DIR}/{name}")
            for name in (COMPILED_PACKAGE, COMPILED_GATE)
        }
        if not all(wanted.values()):
            return None, f"run {run_id}'s compiled package carries no recorded digest"
        found = {name: sha256_file(target / name) for name in wanted}
        if found != wanted:
            return None, (
                f"run {run_id}'s compiled package differs from the one registered "
                f"({', '.join(n for n in wanted if found[n] != wanted[n])}); not loaded"
            )
    report = json.loads((target / COMPILED_GATE).read_text())
    if not report.get("passed"):
        reasons = "; ".join(report.get("reasons") or ["no reason recorded"])
        return None, f"the compile gate of run {run_id} failed: {reasons}"
    return target / COMPILED_PACKAGE, ""


def load_version(
    settings: Settings | None,
    version: str,
    *,
    with_package: bool = False,
    role: str = ANY_ROLE,
) -> LoadedModel:
    """Registered version ``version`` of the pre-ranking model (eval mode); ``with_package``
    (the server): also download an FSCD version's gate-passed compiled package
    (:func:`fetch_compiled`) into ``LoadedModel.compiled``.

    Before anything is downloaded the version's release must verify with a trusted key
    (:func:`cascade.signing.verified_release`; ``role`` champion, the alias a version is
    served under: a promoted one; a load by number takes any signed version); the files
    are then checked against the signed digests, and the package is offered only when the
    signed compile verdict passed. Raises :class:`~cascade.signing.UnsignedRelease` (a
    :class:`~cascade.artifacts.TamperedArtifact`) otherwise."""
    client, settings = _client(settings)
    registered = client.get_model_version(REGISTERED_MODEL, version)
    uri = f"models:/{REGISTERED_MODEL}/{version}"
    release = verified_release(registered, trusted_keys(settings.home), role=role)
    expected = dict(release.files)
    # Where the registry of these settings keeps the files (a models:/ URI would resolve in
    # MLflow's process-wide registry, which may be another store).
    location = client.get_model_version_download_uri(REGISTERED_MODEL, version)
    cache = settings.home / "serving" / "compiled"
    wants_package = with_package and release.compiled_passed
    network, encoder, kept = _load_checked(
        settings, uri, location, expected, keep_compiled=cache if wants_package else None
    )
    auc_tag = registered.tags.get(TEST_AUC_TAG)
    test_auc = (
        float(auc_tag)
        if auc_tag is not None
        else float(client.get_run(registered.run_id).data.metrics.get("test_auc", float("nan")))
    )
    compiled, reason = None, "a PreRanker is served eagerly"
    if not with_package:
        reason = "not fetched (with_package=False)"
    elif encoder is not None and not release.compiled_passed:
        reason = f"the compile gate of {uri} did not pass (its signed verdict); no package"
    elif encoder is not None and any(name.startswith(COMPILED_DIR + "/") for name in expected):
        compiled = kept  # from the version's own release folder, checked with the rest
        reason = "" if kept else f"{uri}'s compiled package did not pass its gate report"
    elif encoder is not None:
        try:
            compiled, reason = fetch_compiled(
                settings, str(registered.run_id), cache, expected=expected
            )
        except Exception as exc:  # the eager network still serves; say why
            reason = f"the compiled package did not download: {type(exc).__name__}: {exc}"
    return LoadedModel(
        model=network.eval(),
        version=str(registered.version),
        run_id=str(registered.run_id),
        test_auc=test_auc,
        encoder=encoder,
        compiled=compiled,
        compiled_reason=reason,
    )


def _load_checked(
    settings: Settings,
    uri: str,
    location: str,
    expected: Mapping[str, str],
    *,
    keep_compiled: Path | None = None,
) -> tuple[nn.Module, FieldEncoder | None, Path | None]:
    """Download version ``uri`` from ``location``, check every file against ``expected`` and
    rebuild the network from its state dict and JSON (never through MLflow's loader, which
    would run the code and read whatever ``MLmodel`` names). With ``keep_compiled`` (a cache
    folder), a release's checked compiled package is kept there when its gate report passed:
    ``(network, encoder, package or None)``."""
    model_files = {k: v for k, v in expected.items() if not k.startswith(RUN_FILES)}
    cold = f"artifacts/{COLD_DIR_ARTIFACT}"
    with tempfile.TemporaryDirectory(prefix="cascade-load-") as tmp:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=location, dst_path=tmp, tracking_uri=settings.tracking_uri
            )
        )
        (local / REGISTRY_META).unlink(missing_ok=True)
        if (local / cold / COLD_CONFIG_FILE).is_file():
            names = [COLD_STATE_FILE, COLD_CONFIG_FILE, ENCODER_FILE]
            if (local / cold / FIELDS_FILE).is_file():
                names.append(FIELDS_FILE)  # absent only in versions registered before it
            needed = [f"{cold}/{name}" for name in names]
            verify(local, model_files, uri, needed=needed)
            model, encoder, _ = load_cold_dir(local / cold)
            kept = (
                None if keep_compiled is None else _keep_compiled(local, keep_compiled, model_files)
            )
            return model, encoder, kept
        state, config = _mlp_files(local)
        if state is None or config is None:
            raise TamperedArtifact(
                f"{uri} holds neither an FSCD pre-ranker ({cold}/) nor a PreRanker state dict "
                "and config; retrain and register it"
            )
        verify(local, model_files, uri, needed=[state, config])
        network, _ = load_model_dir(local / state, local / config)
        return network, None, None


def _keep_compiled(local: Path, cache: Path, digests: Mapping[str, str]) -> Path | None:
    """The checked release folder ``local``'s compiled package, moved into
    ``cache/<its digest>/`` (once: a folder of that content address is reused), when its gate
    report says passed; None otherwise."""
    folder = local / COMPILED_DIR
    package = folder / COMPILED_PACKAGE
    if not package.is_file() or not (folder / COMPILED_GATE).is_file():
        return None
    if json.loads((folder / COMPILED_GATE).read_text()).get("passed") is not True:
        return None
    target = cache / digests[f"{COMPILED_DIR}/{COMPILED_PACKAGE}"]
    if not (target / COMPILED_PACKAGE).is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.rename(target)
        except OSError:  # another worker's copy got there first, or another filesystem
            if not (target / COMPILED_PACKAGE).is_file():
                shutil.copytree(folder, target, dirs_exist_ok=True)
    if sha256_file(target / COMPILED_PACKAGE) != digests[f"{COMPILED_DIR}/{COMPILED_PACKAGE}"]:
        shutil.rmtree(target, ignore_errors=True)  # changed on this disk: fetched again next time
        return None
    return target / COMPILED_PACKAGE


def _mlp_files(local: Path) -> tuple[str | None, str | None]:
    """(state dict, config) of a PreRanker pyfunc folder, relative to it (None when absent)."""
    artifacts = local / "artifacts"
    states = sorted(artifacts.glob("*.pt")) if artifacts.is_dir() else []
    configs = sorted(artifacts.glob("*.json")) if artifacts.is_dir() else []
    if len(states) != 1 or len(configs) != 1:
        return None, None
    return states[0].relative_to(local).as_posix(), configs[0].relative_to(local).as_posix()
