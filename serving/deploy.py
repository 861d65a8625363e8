"""Roll-out check and a tiny client for the running pre-ranking server.

The server swaps versions by itself (it polls the registry); :func:`roll_out` is the DAG task
that waits until the server answers with the registry's current champion. From the shell::

    .venv/bin/python -c "from serving.deploy import roll_out; print(roll_out('2026-11-22'))"
    .venv/bin/python -c "from serving.deploy import score; print(score(1, [1, 2, 3]))"

Nothing heavy is imported here (no torch, no kserve): Airflow tasks import this module.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import requests

from cascade.config import Settings, load_settings
from cascade.lake import check_ds
from models.preranking import REGISTERED_MODEL

log = logging.getLogger(__name__)

MODEL_NAME = "preranking"
PROBE_REQUEST_PREFIX = "rollout-probe-"
"""Request ids of roll-out probes start with this, so feedback logging can drop them."""


def infer_url(settings: Settings) -> str:
    return f"{settings.serving_url}/v2/models/{MODEL_NAME}/infer"


def _request_body(user_id: int, item_ids: list[int], request_id: str) -> dict[str, Any]:
    return {
        "id": request_id,
        "inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [int(user_id)]},
            {
                "name": "item_ids",
                "datatype": "INT64",
                "shape": [len(item_ids)],
                "data": [int(i) for i in item_ids],
            },
        ],
    }


def score(
    user_id: int,
    item_ids: list[int],
    *,
    settings: Settings | None = None,
    request_id: str | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Scores from the running server: ``{"id", "request_id", "model_version", "scores":
    [float, ...]}``; ``request_id`` is the server's own id of the request (clicks name it).

    Raises RuntimeError with the server's message when it answers with an error status, and
    ConnectionError (from requests) when nothing listens at ``settings.serving_url``.
    """
    settings = settings or load_settings()
    body = _request_body(user_id, item_ids, request_id or uuid.uuid4().hex)
    response = requests.post(
        infer_url(settings),
        json=body,
        headers=settings.serving.auth_headers(),
        timeout=timeout_s,
    )
    if response.status_code != 200:
        raise RuntimeError(
            f"{infer_url(settings)} answered {response.status_code}: {response.text[:500]}"
        )
    payload = response.json()
    outputs = {o["name"]: o for o in payload.get("outputs", [])}
    if "scores" not in outputs:
        raise RuntimeError(f"{infer_url(settings)} returned no 'scores' output: {payload}")
    return {
        "id": payload.get("id"),
        "request_id": (payload.get("parameters") or {}).get("request_id"),
        "model_version": (payload.get("parameters") or {}).get("model_version")
        or payload.get("model_version"),
        "scores": [float(s) for s in outputs["scores"]["data"]],
    }


def served_version(settings: Settings, *, timeout_s: float = 5.0) -> str | None:
    """The version the server answers with now, or None while it is down or not ready."""
    try:
        ready = requests.get(
            f"{settings.serving_url}/v2/models/{MODEL_NAME}/ready",
            headers=settings.serving.auth_headers(),
            timeout=timeout_s,
        )
        if ready.status_code != 200:
            return None
        # KServe's model metadata has no version field it fills, so a one-candidate
        # inference is the reliable way to read the version that answers requests.
        probe = score(
            0,
            [0],
            settings=settings,
            request_id=f"{PROBE_REQUEST_PREFIX}{uuid.uuid4().hex}",
            timeout_s=timeout_s,
        )
    except (requests.RequestException, RuntimeError) as exc:
        log.debug("serving probe failed: %s", exc)
        return None
    version = probe["model_version"]
    return None if version is None else str(version)


def _registry_champion(settings: Settings) -> str | None:
    from models.preranking.inference import alias_version

    return alias_version(settings)


def _promotion(settings: Settings, ds: str) -> dict[str, Any]:
    """What the registry decided for ``ds``'s challenger, so a blocked deployment says why."""
    from cascade.registry import registry_report_path

    path = registry_report_path(ds, settings)
    if not path.exists():
        return {}
    decision = json.loads(path.read_text())
    if not decision.get("promoted", True):
        log.warning(
            "ds=%s: challenger version %s was not deployed: %s",
            ds,
            decision.get("version"),
            "; ".join(decision.get("reasons") or []),
        )
    return {
        "challenger_version": decision.get("version"),
        "promoted": decision.get("promoted"),
        "blocked_by": decision.get("reasons") or [],
    }


def roll_out(
    ds: str,
    *,
    settings: Settings | None = None,
    timeout_s: float = 120,
    poll_s: float = 1.0,
    champion_version: Callable[[Settings], str | None] | None = None,
) -> dict[str, Any]:
    """Wait until the server answers with the registry's champion version.

    ``ds`` is the partition the champion was trained for (logged; the check itself does not
    depend on it). Returns ``{"served_version", "champion_version", "url", "waited_s"}``;
    raises TimeoutError when the server does not serve the champion within ``timeout_s``,
    RuntimeError when the registry has no champion.
    """
    check_ds(ds)
    settings = settings or load_settings()
    champion = (champion_version or _registry_champion)(settings)
    if champion is None:
        raise RuntimeError(
            f"the registry has no champion alias for {REGISTERED_MODEL!r}; "
            "register and promote a model before rolling out"
        )
    url = infer_url(settings)
    served, waited = wait_until_served(
        str(champion),
        lambda: served_version(settings),
        timeout_s=timeout_s,
        poll_s=poll_s,
        what=f"ds={ds}: {url}",
        hint=f"check that the server runs (python -m serving.server) and its log under "
        f"{settings.logs_dir}",
    )
    return {
        "served_version": served,
        "champion_version": str(champion),
        "url": url,
        "waited_s": round(waited, 3),
        **_promotion(settings, ds),
    }


def wait_until_served(
    champion: str,
    served_version: Callable[[], str | None],
    *,
    timeout_s: float,
    poll_s: float,
    what: str,
    hint: str,
) -> tuple[str, float]:
    """Poll ``served_version()`` until it is ``champion``; ``(version, seconds waited)``.
    TimeoutError naming ``what`` and the ``hint`` when it is not within ``timeout_s``."""
    started = time.monotonic()
    while True:
        served = served_version()
        waited = time.monotonic() - started
        if served == champion:
            log.info("%s serves champion version %s after %.1fs", what, served, waited)
            return served, waited
        if waited >= timeout_s:
            raise TimeoutError(
                f"{what} still serves version {served!r} (None = down or not ready) after "
                f"{timeout_s:.0f}s, but the registry's champion is {champion!r}; {hint}"
            )
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
