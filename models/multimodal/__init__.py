"""Image-text transformer with mixture-of-experts feed-forward blocks (DeepSpeed MoE)."""

REGISTERED_MODEL = "multimodal"
"""The image-text model's name in the MLflow registry: the ``multimodal`` spec registers it
under this name (``cascade pipelines --json``)."""
