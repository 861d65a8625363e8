"""Load the registered pre-ranking model for serving, evaluation and the registry.

A trained model is logged to MLflow as a pyfunc (:class:`PreRankerPyfunc`) whose artifacts are
the fp32 ``state_dict`` and the run's :class:`TrainConfig` as JSON, so it loads wherever
``models.preranking`` is importable. Serving uses :func:`load_registered` to get the plain
``nn.Module`` behind an alias::

    python -c "from models.preranking.inference import load_registered; print(load_registered())"
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.pyfunc.model import PythonModel, PythonModelContext
from mlflow.tracking import MlflowClient

from cascade.config import Settings, load_settings
from cascade.ctr_schema import MODEL_FEATURES
from cascade.registry import TEST_AUC_TAG, version_by_alias
from models.preranking.config_registry import TrainConfig
from models.preranking.model import PreRanker

STATE_DICT_ARTIFACT = "state_dict"
CONFIG_ARTIFACT = "train_config"


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
            "cascade.ctr_schema.MODEL_FEATURES"
        )
    dense = torch.from_numpy(frame[list(MODEL_FEATURES)].to_numpy(dtype=np.float32))
    user = torch.from_numpy(frame["user_id"].to_numpy(dtype=np.int64))
    item = torch.from_numpy(frame["item_id"].to_numpy(dtype=np.int64))
    return dense, user, item


class PreRankerPyfunc(PythonModel):
    """MLflow pyfunc: a frame of ids + MODEL_FEATURES in, click probabilities out."""

    model: PreRanker | None = None
    config: TrainConfig | None = None

    def load_context(self, context: PythonModelContext) -> None:
        self.model, self.config = load_model_dir(
            Path(context.artifacts[STATE_DICT_ARTIFACT]), Path(context.artifacts[CONFIG_ARTIFACT])
        )

    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("PreRankerPyfunc.predict before load_context; load it via mlflow")
        with torch.no_grad():
            return torch.sigmoid(self.model(*frame_inputs(model_input))).numpy()


@dataclass
class LoadedModel:
    """A registered model version, ready to score."""

    model: PreRanker
    """The network, fp32, in eval mode."""
    version: str
    """Registry version number."""
    run_id: str
    """MLflow run that trained it."""
    test_auc: float
    """Hold-out AUC measured at training time."""


def _client(settings: Settings | None) -> tuple[MlflowClient, Settings]:
    settings = settings or load_settings()
    uri = settings.tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri), settings


def alias_version(settings: Settings | None = None, alias: str = "champion") -> str | None:
    """The version the alias points at, or None when the model or alias does not exist yet."""
    client, settings = _client(settings)
    version = version_by_alias(client, settings.registered_model, alias)
    return None if version is None else str(version.version)


def load_registered(
    settings: Settings | None = None, alias: str = "champion"
) -> LoadedModel | None:
    """The model behind ``alias`` (eval mode), or None when nothing is registered there yet."""
    client, settings = _client(settings)
    version = version_by_alias(client, settings.registered_model, alias)
    if version is None:
        return None
    # Load by number, not alias: the alias may move while we download.
    return load_version(settings, str(version.version))


def load_version(settings: Settings | None, version: str) -> LoadedModel:
    """Registered version ``version`` of the pre-ranking model (eval mode)."""
    client, settings = _client(settings)
    registered = client.get_model_version(settings.registered_model, version)
    uri = f"models:/{settings.registered_model}/{version}"
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_registry_uri(settings.tracking_uri)
    wrapper = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    if not isinstance(wrapper, PreRankerPyfunc) or wrapper.model is None:
        raise RuntimeError(
            f"{uri} is not a pre-ranking model logged by models.preranking.train "
            f"(got {type(wrapper).__name__}); retrain and register it"
        )
    auc_tag = registered.tags.get(TEST_AUC_TAG)
    test_auc = (
        float(auc_tag)
        if auc_tag is not None
        else float(client.get_run(registered.run_id).data.metrics.get("test_auc", float("nan")))
    )
    return LoadedModel(
        model=wrapper.model.eval(),
        version=str(registered.version),
        run_id=str(registered.run_id),
        test_auc=test_auc,
    )
