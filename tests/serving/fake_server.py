"""The real KServe model server with fake registry and store, for tests/serving.

    CASCADE_TEST_CHAMPION_FILE=/tmp/champion.json CASCADE_SERVING_PORT=28181 \
        .venv/bin/python tests/serving/fake_server.py
"""

from __future__ import annotations

import serving_fakes

from cascade.config import load_settings
from serving.preranking import PreRankingModel, ServingConfig
from serving.server import serve, workers_from_env


def main() -> None:
    settings = load_settings()
    champion_file = settings.hooks.test_champion_file
    if champion_file is None:
        raise SystemExit("set CASCADE_TEST_CHAMPION_FILE to the champion JSON to serve")
    config = ServingConfig.from_env()
    serve(
        lambda: [
            PreRankingModel(
                settings=settings,
                config=config,
                backends=serving_fakes.backends(champion_file),
            )
        ],
        settings,
        workers=workers_from_env(),
    )


if __name__ == "__main__":
    main()
