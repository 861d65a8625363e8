"""Pre-ranking model of the CTR cascade."""

REGISTERED_MODEL = "preranking"
"""The pre-ranker's name in the MLflow registry: the ``ctr_preranking`` spec registers it under
this name (``cascade pipelines --json``), the loader and the server follow its aliases."""

PROMOTION_METRICS = {"auc": True, "logloss": False}
"""The held-out metrics the register step can compare two versions on, each with whether
higher is better (what :func:`models.preranking.training_set.evaluate` measures)."""
