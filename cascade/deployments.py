"""Deployment safety: rollback of a registered model's champion alias, by command or on a
serving error rate.

    cascade rollback --model MODEL [--reason TEXT]   # champion -> the version it replaced

The server follows the ``champion`` alias by polling the registry, so moving the alias is the
whole rollback: no restart. Each champion version carries the version it replaced
(``cascade.previous_champion``, written by :mod:`cascade.registry` before the alias moves), so
rollbacks chain: two rollbacks go back two promotions.

A rollback is a compare-and-set: it names the champion it means to replace (the one it read,
or the version whose errors it saw), and moves the alias only if that version is still the
champion, re-read under the registry's alias lock (:mod:`cascade.alias_lock`) that promotions
hold too. Two workers that see the same errors, or two operators typing the same command,
roll back once: the other gets a result with ``moved: false`` saying which version is champion
now, and a log line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from cascade.alias_lock import alias_lock
from cascade.assets import TOPIC_MODEL_DEPLOYED
from cascade.config import Settings, load_settings
from cascade.registry import CHAMPION, PREVIOUS_CHAMPION_TAG

ROLLED_BACK_TAG = "cascade.rolled_back"
"""Tag on a version that was rolled back: JSON with reason and time (it stays registered)."""

log = logging.getLogger(__name__)


class Aliases(Protocol):
    """The registry operations a rollback needs (MLflow in production, a dict in tests)."""

    def alias_version(self, model: str, alias: str) -> str | None: ...
    def version_tag(self, model: str, version: str, key: str) -> str | None: ...
    def set_alias(self, model: str, alias: str, version: str) -> None: ...
    def set_version_tag(self, model: str, version: str, key: str, value: str) -> None: ...
    def locked(self) -> contextlib.AbstractContextManager[Any]:
        """Held around the read, check and move of an alias (no other move in between)."""
        ...


class MlflowAliases:
    """:class:`Aliases` on the MLflow model registry."""

    def __init__(self, settings: Settings) -> None:
        from mlflow.tracking import MlflowClient

        from cascade.tracking_auth import use_tracking_credentials

        use_tracking_credentials(settings)
        uri = settings.tracking_uri
        self.settings = settings
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        return alias_lock(self.client, settings=self.settings)

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
    model: str,
    reason: str = "manual",
    automatic: bool = False,
    settings: Settings | None = None,
    aliases: Aliases | None = None,
    publish: bool = True,
    expected: str | None = None,
) -> dict[str, Any]:
    """Point registered model ``model``'s ``champion`` back at the version the current
    champion replaced, if the champion is still ``expected`` (default: the version read when
    called); returns what moved and publishes
    ``cascade.model.deployed`` (reason ``rollback`` / ``automatic-rollback``).

    The result has ``moved``: False when the champion was no longer ``expected`` under the
    alias lock (another rollback or a promotion moved it first); nothing changed then."""
    settings = settings or load_settings()
    aliases = aliases or MlflowAliases(settings)
    if expected is None:
        expected = aliases.alias_version(model, CHAMPION)
        if expected is None:
            raise ValueError(f"model {model!r} has no {CHAMPION!r} alias; nothing to roll back")
    record = {"reason": reason, "automatic": automatic, "at": dt.datetime.now(dt.UTC).isoformat()}
    with aliases.locked():
        current = aliases.alias_version(model, CHAMPION)
        if current != expected:
            skipped = (
                f"{model}: not rolled back: the champion is {_named(current)}, no longer "
                f"v{expected} (another rollback or a promotion moved it first)"
            )
            log.warning("%s", skipped)
            return {
                "model": model,
                "moved": False,
                "expected_version": expected,
                "champion_version": current,
                "skipped": skipped,
                **record,
            }
        previous = aliases.version_tag(model, expected, PREVIOUS_CHAMPION_TAG) or None
        if previous is None:
            raise ValueError(
                f"{model} version {expected} records no previous champion (it was the first "
                f"one); promote another version instead of rolling back"
            )
        # Tag first: if the alias move fails, the tag only says a rollback was attempted.
        aliases.set_version_tag(model, expected, ROLLED_BACK_TAG, json.dumps(record))
        aliases.set_alias(model, CHAMPION, previous)
    log.warning("%s: champion rolled back from v%s to v%s (%s)", model, expected, previous, reason)
    result: dict[str, Any] = {
        "model": model,
        "moved": True,
        "from_version": expected,
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
                "previous_version": expected,
                "reason": "automatic-rollback" if automatic else "rollback",
            },
            source="cascade-deployments",
        )
        try:
            result["event"] = publish_event(event, settings=settings)
        except Exception as exc:  # the rollback itself is done; the event is informational
            result["event_error"] = f"{type(exc).__name__}: {exc}"
    return result


def _named(version: str | None) -> str:
    return "none" if version is None else f"v{version}"


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
    model: str,
    served_version: str,
    requests: int,
    errors: int,
    policy: ErrorRatePolicy | None = None,
    settings: Settings | None = None,
    aliases: Aliases | None = None,
    publish: bool = True,
) -> dict[str, Any] | None:
    """Roll back if the served version's error rate crosses the policy (None when it does not)
    and that version is still the champion: compare and set, so a second watcher seeing the
    same errors gets ``moved: False`` instead of rolling back a second time.

    ``errors`` are the model's own: requests that failed on a feature-store lock timeout are
    not counted by the server (:class:`serving.shadow.ServingObserver`), a rollback would not
    bring the store back."""
    policy = policy or ErrorRatePolicy()
    if not should_roll_back(requests, errors, policy):
        return None
    settings = settings or load_settings()
    return rollback(
        model=model,
        reason=f"error rate {errors}/{requests} > {policy.max_error_rate} "
        f"on version {served_version}",
        automatic=True,
        settings=settings,
        aliases=aliases,
        publish=publish,
        expected=served_version,
    )
