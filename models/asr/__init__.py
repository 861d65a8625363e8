"""ASR: ConvDFSMN acoustic model with CTC, trained on the speech corpus (jobs.audio_corpus)."""

REGISTERED_MODEL = "asr"
"""The ASR model's name in the MLflow registry: the ``asr`` spec registers it under this name
(``cascade pipelines --json``), the server follows its aliases and serves it under it too."""
