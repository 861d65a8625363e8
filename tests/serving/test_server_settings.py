"""The model server's process settings: workers, torch threads and logging from the environment."""

from __future__ import annotations

import pytest

from serving.server import set_torch_threads, stdout_log_config, workers_from_env


def test_server_process_settings_validate_the_environment() -> None:
    assert workers_from_env({}) == 1 and workers_from_env({"CASCADE_SERVING_WORKERS": "2"}) == 2
    with pytest.raises(ValueError, match="CASCADE_SERVING_WORKERS"):
        workers_from_env({"CASCADE_SERVING_WORKERS": "0"})
    with pytest.raises(ValueError, match="CASCADE_SERVING_TORCH_THREADS must be an integer"):
        set_torch_threads({"CASCADE_SERVING_TORCH_THREADS": "two"})
    quiet, verbose = stdout_log_config(), stdout_log_config(request_log=True)
    assert quiet["loggers"]["uvicorn.access"]["level"] == "WARNING"
    assert quiet["loggers"]["kserve.trace"]["level"] == "WARNING"
    assert verbose["loggers"]["uvicorn.access"]["level"] != "WARNING"
