"""The pre-ranking server's client: scores, the version that answers, and the roll-out check.

The server swaps versions by itself (it polls the registry); :func:`roll_out` is the
``ctr_preranking`` deploy step, which waits until the server answers with the registry's
current champion (a one-candidate probe request, :meth:`serving.v2_client.V2Client.served_version`).
From the shell: ``cascade score --model preranking --user 1 --items 1 2 3``.

Nothing heavy is imported here (no torch, no kserve): Airflow tasks import this module.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from cascade.config import Settings, load_settings
from cascade.lake import check_ds
from models.preranking import REGISTERED_MODEL
from serving.v2_client import V2Client, outputs, response_version, wait_until_served

log = logging.getLogger(__name__)

MODEL_NAME = "preranking"
PROBE_REQUEST_PREFIX = "rollout-probe-"
"""Request ids of roll-out probes start with this, so feedback logging can drop them."""


def client(settings: Settings) -> V2Client:
    """The pre-ranker on the settings' model server."""
    return V2Client(settings.serving_url, MODEL_NAME, settings.serving.auth_headers())


def infer_url(settings: Settings) -> str:
    return client(settings).infer_url


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
    binary: bool = False,
) -> dict[str, Any]:
    """Scores from the running server: ``{"id", "request_id", "model_version", "scores":
    [float, ...]}``; ``request_id`` is the server's own id of the request (clicks name it).

    Raises RuntimeError with the server's message when it answers with an error status, and
    ConnectionError (from requests) when nothing listens at ``settings.serving_url``.
    ``binary``: the ids go as raw INT64 bytes and the scores come back as raw FP32 bytes (the
    v2 binary tensor extension), the same scores as JSON's.
    """
    settings = settings or load_settings()
    body = _request_body(user_id, item_ids, request_id or uuid.uuid4().hex)
    payload = client(settings).infer(body, timeout_s=timeout_s, output="scores", binary=binary)
    scores = next(o for o in outputs(payload) if o.get("name") == "scores")
    return {
        "id": payload.get("id"),
        "request_id": (payload.get("parameters") or {}).get("request_id"),
        "model_version": response_version(payload),
        "scores": [float(s) for s in scores["data"]],
    }


def served_version(settings: Settings, *, timeout_s: float = 5.0) -> str | None:
    """The version the server answers with now, or None while it is down or not ready."""
    return client(settings).served_version(
        lambda: _request_body(0, [0], f"{PROBE_REQUEST_PREFIX}{uuid.uuid4().hex}"),
        timeout_s=timeout_s,
        output="scores",
    )


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
    rolled_out = wait_until_served(
        str(champion),
        lambda: served_version(settings),
        url=infer_url(settings),
        ds=ds,
        timeout_s=timeout_s,
        poll_s=poll_s,
        hint=f"check that the stack's pre-ranking server is up (cascade status) and its log under "
        f"{settings.logs_dir}",
    )
    return {**rolled_out, **_promotion(settings, ds)}
