"""Model serving: KServe models (Open Inference Protocol v2), the server, roll-out checks."""
