"""The code file of a logged pre-ranker (MLflow "models from code"): MLflow runs it to load a
version the standard way (``mlflow.pyfunc.load_model``); the weights come from the version's
artifacts through :class:`~models.preranking.inference.PreRankingPyfunc`, never a pickle."""

from mlflow.models import set_model

from models.preranking.inference import PreRankingPyfunc

set_model(PreRankingPyfunc())
