"""The code file of a registered ASR version (MLflow "models from code"): MLflow runs it from
the downloaded version folder, and :class:`~models.asr.pyfunc.AsrPyfunc` reads the model file
beside it as data (never a pickle)."""

from pathlib import Path

from mlflow.models import set_model

from models.asr.pyfunc import AsrPyfunc

set_model(AsrPyfunc(Path(__file__).resolve().parent))
