"""The model server: KServe's ``ModelServer`` with the pre-ranking model, HTTP only.

Run it (binds ``settings.host``:``settings.ports.serving``, 127.0.0.1:28081 by default)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m serving.server

It starts before any champion exists: ``/v2/health/live`` answers at once, the model reports
not ready (503) until the registry's champion alias appears, then it loads it by itself.
Environment: ``CASCADE_*`` (see :mod:`cascade.config`), ``CASCADE_SERVING_POLL_S``,
``CASCADE_SERVING_MAX_CANDIDATES`` (see :class:`serving.preranking.ServingConfig`).
Stop it with SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from kserve import ModelServer
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
from kserve.logging import KSERVE_LOG_CONFIG, configure_logging
from kserve.model import BaseKServeModel
from kserve.protocol.rest.server import RESTServer

from cascade.config import Settings, load_settings

# Not __name__: under ``python -m`` that is "__main__", which the "serving" logger misses.
log = logging.getLogger("serving.server")


def stdout_log_config() -> dict[str, Any]:
    """KServe's logging config with every handler on stdout (KServe's default is stderr)."""
    config = copy.deepcopy(KSERVE_LOG_CONFIG)
    for handler in config["handlers"].values():
        handler["stream"] = "ext://sys.stdout"
    config["handlers"]["cascade"] = dict(config["handlers"]["kserve"])
    config["loggers"]["serving"] = {"handlers": ["cascade"], "level": "INFO", "propagate": False}
    return config


class LocalModelServer(ModelServer):
    """``ModelServer`` that binds one host, serves REST only, and starts with unready models.

    KServe 0.21's ``ModelServer.start`` hard-codes ``host="0.0.0.0"`` in its uvicorn config,
    starts gRPC unless told otherwise, registers only models that are ready and raises
    ``NoModelReady`` when none is. A model that waits for its first registry version must be
    registered anyway, so ``start`` is replaced by the single-worker branch of the original.
    """

    def __init__(self, *, host: str, http_port: int, **kwargs: Any) -> None:
        super().__init__(http_port=http_port, workers=1, enable_grpc=False, **kwargs)
        self.host = host

    def start(self, models: list[BaseKServeModel]) -> None:
        if not models:
            raise ValueError("LocalModelServer.start needs at least one model to serve")
        for model in models:
            self.register_model(model)
            model.enable_latency_logging = self.enable_latency_logging
            model.start()
        self._rest_server = RESTServer(
            FASTAPI_APP_IMPORT_STRING,
            self.dataplane,
            self.model_repository_extension,
            self.http_port,
            access_log_format=self.access_log_format,
            workers=1,
            grace_period=self.grace_period,
            event_loop=self.event_loop,
            timeout_keep_alive=self.timeout_keep_alive,
        )
        self._rest_server.config.host = self.host
        self.servers.append(self._rest_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


def serve(models: list[BaseKServeModel], settings: Settings) -> None:
    """Serve ``models`` on ``settings.host:settings.ports.serving`` until SIGTERM/SIGINT."""
    configure_logging(stdout_log_config())
    log.info("model server on http://%s:%d", settings.host, settings.ports.serving)
    LocalModelServer(host=settings.host, http_port=settings.ports.serving).start(models)


def main() -> None:
    from serving.preranking import PreRankingModel, ServingConfig

    settings = load_settings()
    serve([PreRankingModel(settings=settings, config=ServingConfig.from_env())], settings)


if __name__ == "__main__":
    main()
