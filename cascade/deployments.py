"""Deployment safety: rollback of a registered model's champion alias, by command or on a
serving error rate.

    cascade rollback --model preranking [--reason TEXT]   # champion -> the version it replaced

The server follows the ``champion`` alias by polling the registry, so moving the alias is the
whole rollback: no restart. Each champion version carries the version it replaced
(``cascade.previous_champion``, written by :mod:`cascade.registry` before the alias moves), so
rollbacks chain: two rollbacks go back two promotions.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Protocol

from cascade.assets import TOPIC_MODEL_DEPLOYED
from cascade.config import Settings, load_settings
from cascade.registry import CHAMPION, PREVIOUS_CHAMPION_TAG

ROLLED_BACK_TAG = "cascade.rolled_back"
"""Tag on a version that was rolled back: JSON with reason and time (it stays registered)."""


class Aliases(Protocol):
    """The registry operations a rollback needs (MLflow in production, a dict in tests)."""

    def alias_version(self, model: str, alias: str) -> str | None: ...
    def version_tag(self, model: str, version: str, key: str) -> str | None: ...
    def set_alias(self, model: str, alias: str, version: str) -> None: ...
    def set_version_tag(self, model: str, version: str, key: str, value: str) -> None: ...


class MlflowAliases:
    """:class:`Aliases` on the MLflow model registry."""

    def __init__(self, settings: Settings) -> None:
        from mlflow.tracking import MlflowClient

        uri = settings.tracking_uri
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    def alias_version(self, model: str, alias: str) -> str | None:
        from cascade.registry import version_by_alias

        version = version_by_alias(self.client, model, alias)
        return None if version is None else str(version.version)

    def version_tag(self, model: str, version: str, key: str) -> str | None:
        return self.client.get_model_version(model, version).tags.get(key)

    def set_alias(self, model: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(model, alias, version)

    def set_version_tag(self, model: str, version: str, key: str, value: str) -> None:
        self.client.set_model_version_tag(model, version, key, value)


def rollback(
    *,
    reason: str = "manual",
    automatic: bool = False,
    settings: Settings | None = None,
    aliases: Aliases | None = None,
    publish: bool = True,
    model: str | None = None,
) -> dict[str, Any]:
    """Point ``model``'s ``champion`` (default: the pre-ranker, ``settings.registered_model``)
    back at the version the current champion replaced; returns what moved and publishes
    ``cascade.model.deployed`` (reason ``rollback`` / ``automatic-rollback``)."""
    settings = settings or load_settings()
    aliases = aliases or MlflowAliases(settings)
    model = model or settings.registered_model
    current = aliases.alias_version(model, CHAMPION)
    if current is None:
        raise ValueError(f"model {model!r} has no {CHAMPION!r} alias; nothing to roll back")
    previous = aliases.version_tag(model, current, PREVIOUS_CHAMPION_TAG) or None
    if previous is None:
        raise ValueError(
            f"{model} version {current} records no previous champion (it was the first one); "
            f"promote another version instead of rolling back"
        )
    record = {"reason": reason, "automatic": automatic, "at": dt.datetime.now(dt.UTC).isoformat()}
    # Tag first: if the alias move fails, the tag only says a rollback was attempted.
    aliases.set_version_tag(model, current, ROLLED_BACK_TAG, json.dumps(record))
    aliases.set_alias(model, CHAMPION, previous)
    result: dict[str, Any] = {
        "model": model,
        "from_version": current,
        "to_version": previous,
        **record,
    }
    if publish:
        from cascade.broker import publish as publish_event
        from cascade.events import make_event

        event = make_event(
            TOPIC_MODEL_DEPLOYED,
            {
                "model": model,
                "alias": CHAMPION,
                "version": previous,
                "previous_version": current,
                "reason": "automatic-rollback" if automatic else "rollback",
            },
            source="cascade-deployments",
        )
        try:
            result["event"] = publish_event(event, settings=settings)
        except Exception as exc:  # the rollback itself is done; the event is informational
            result["event_error"] = f"{type(exc).__name__}: {exc}"
    return result


@dataclass(kw_only=True)
class ErrorRatePolicy:
    """When serving errors roll the champion back automatically."""

    max_error_rate: float = 0.05
    """Roll back when errors / requests of the served version exceed this..."""
    min_requests: int = 200
    """...over at least this many requests (a handful of errors is noise, not a signal)."""

    def __post_init__(self) -> None:
        if not 0 < self.max_error_rate < 1:
            raise ValueError("max_error_rate must be in (0, 1)")
        if self.min_requests < 1:
            raise ValueError("min_requests must be >= 1")


def should_roll_back(requests: int, errors: int, policy: ErrorRatePolicy) -> bool:
    return requests >= policy.min_requests and errors / requests > policy.max_error_rate


def auto_rollback(
    *,
    served_version: str,
    requests: int,
    errors: int,
    policy: ErrorRatePolicy | None = None,
    settings: Settings | None = None,
    aliases: Aliases | None = None,
    publish: bool = True,
) -> dict[str, Any] | None:
    """Roll back if the served version's error rate crosses the policy and that version is
    still the champion (a second watcher seeing the same errors must not roll back twice)."""
    policy = policy or ErrorRatePolicy()
    if not should_roll_back(requests, errors, policy):
        return None
    settings = settings or load_settings()
    aliases = aliases or MlflowAliases(settings)
    if aliases.alias_version(settings.registered_model, CHAMPION) != served_version:
        return None
    return rollback(
        reason=f"error rate {errors}/{requests} > {policy.max_error_rate} "
        f"on version {served_version}",
        automatic=True,
        settings=settings,
        aliases=aliases,
        publish=publish,
    )
