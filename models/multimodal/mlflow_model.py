"""The code file of a registered multimodal version (MLflow "models from code"): MLflow runs it
from the downloaded version folder, and :class:`~models.multimodal.pyfunc.MultimodalPyfunc`
reads the stored model files beside it as data (never a pickle)."""

from pathlib import Path

from mlflow.models import set_model

from models.multimodal.pyfunc import MultimodalPyfunc

set_model(MultimodalPyfunc(Path(__file__).resolve().parent))
