"""What the server does beside answering: log feedback, score with a shadow (challenger) version,
and roll the champion back when its error rate crosses the policy. None of it may change or slow
a response. Feedback is appended to :class:`~serving.feedback.FeedbackLog`'s buffer as the
request's column arrays (tens of microseconds) and written by the log's own writer thread, so
none is dropped under load; shadow scoring and rollback checks run on one background thread
with a bounded queue, and are dropped (and counted) when it falls behind.

Enabled by environment variables of the serving process (``cascade up`` passes them on):

    CASCADE_FEEDBACK=0                 do not write scored candidates and their features to the
                                       lake (serving/feedback.py; on by default)
    CASCADE_SHADOW_ALIAS=challenger    also score with this registry alias and log both
    CASCADE_AUTO_ROLLBACK=1            roll back on the error-rate policy (cascade/deployments.py)

The shadow report: ``python -m serving.shadow_report --ds YYYY-MM-DD``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.feedback import FeedbackLog
from serving.feedback_rows import Coded, ItemSnapshot

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ObserverConfig:
    """Background work of the server."""

    feedback: bool = False
    """Log scored candidates to the lake."""
    shadow_alias: str | None = None
    """Registry alias scored in shadow (None: no shadow)."""
    auto_rollback: bool = False
    """Apply the error-rate rollback policy."""
    queue_size: int = 1000
    """Requests waiting for background work; beyond it work is dropped and counted."""

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        if self.shadow_alias == "champion":
            raise ValueError("CASCADE_SHADOW_ALIAS must name another alias than champion")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ObserverConfig:
        from cascade.config import load_settings

        serving = load_settings(env).serving
        return cls(
            feedback=serving.feedback,
            shadow_alias=serving.shadow_alias,
            auto_rollback=serving.auto_rollback,
        )

    @property
    def enabled(self) -> bool:
        return self.feedback or self.shadow_alias is not None or self.auto_rollback


class ServingObserver:
    """Feedback, shadow scoring and error counting for one :class:`PreRankingModel`."""

    def __init__(
        self,
        model: Any,
        config: ObserverConfig,
        *,
        feedback: FeedbackLog | None = None,
        rollback: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.feedback = feedback
        if config.feedback and feedback is None:
            self.feedback = FeedbackLog(model.settings.lake_root, background=True)
        self._rollback = rollback
        self._snapshot: tuple[Any, ItemSnapshot] | None = None
        """The item table last logged and its snapshot (a table is never changed: a refresh
        builds a new one, so the same object means the same snapshot)."""
        self._shadow: Any = None
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(config.queue_size)
        self.dropped = 0
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        """Per version: requests that failed in the model (the automatic rollback's rate)."""
        self.feature_store_timeouts: dict[str, int] = {}
        """Per version: requests that failed because the online store was locked or timed
        out. Neither a request nor an error of the version: a rollback would not help."""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="serving-observer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # background work must never take the server down
                log.exception("serving observer job failed")
            finally:
                self._queue.task_done()

    def _submit(self, job: Callable[[], None]) -> None:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped += 1

    def observed(
        self,
        served: Any,
        response_id: str,
        user_id: int,
        item_ids: np.ndarray,
        scores: np.ndarray,
        user_features: Mapping[str, float] | None = None,
        *,
        client_request_id: str | None = None,
    ) -> None:
        """Called after a successful response was built: count it, log it, shadow it later.

        ``response_id``: the server's own request id (the key clicks join on);
        ``client_request_id``: the id the client sent, kept apart as untrusted.
        ``user_features`` are the user fields as observed (the online store's where the
        server reads them); the item features are those of ``served.items``, logged by
        reference."""
        self._count(served.version, ok=True)
        if self.feedback is None and self.config.shadow_alias is None:
            return
        user = self._features(served, user_features or {})
        snapshot = self._item_snapshot(served.items)
        feedback = self.feedback

        def write(shadow: tuple[str, np.ndarray] | None = None) -> None:
            if feedback is not None:
                feedback.log(
                    request_id=response_id,
                    user_id=user_id,
                    item_ids=item_ids,
                    scores=scores,
                    model_version=served.version,
                    request_features=user,
                    shadow_version=shadow[0] if shadow else None,
                    shadow_scores=shadow[1] if shadow else None,
                    items=snapshot,
                    client_request_id=client_request_id,
                )

        if self.config.shadow_alias is None:
            try:  # an append to the buffer; the writer thread writes it
                write()
            except Exception:
                log.exception("feedback logging failed")
            return
        self._submit(lambda: write(self._shadow_scores(user_id, item_ids)))

    def failed(self, served: Any) -> None:
        """Called when scoring raised: counts toward the error rate of that version."""
        self._count(served.version, ok=False)

    def feature_store_timeout(self, served: Any) -> None:
        """Called when the online store was locked or timed out: counted on its own, never
        toward the error rate (nor as a request of the version)."""
        with self._lock:
            counts = self.feature_store_timeouts
            counts[served.version] = counts.get(served.version, 0) + 1

    def _count(self, version: str, *, ok: bool) -> None:
        with self._lock:
            self.requests[version] = self.requests.get(version, 0) + 1
            if not ok:
                self.errors[version] = self.errors.get(version, 0) + 1
            requests, errors = self.requests[version], self.errors.get(version, 0)
        if self.config.auto_rollback and not ok:
            self._submit(lambda: self._maybe_roll_back(version, requests, errors))

    def _maybe_roll_back(self, version: str, requests: int, errors: int) -> None:
        from cascade.deployments import auto_rollback
        from models.preranking import REGISTERED_MODEL

        rollback = self._rollback or auto_rollback
        result = rollback(
            model=REGISTERED_MODEL,
            served_version=version,
            requests=requests,
            errors=errors,
            settings=self.model.settings,
        )
        if result:
            if result.get("moved", True):
                log.warning("automatic rollback: %s", result)
            else:  # another worker (or a promotion) moved the champion first
                log.info("automatic rollback not needed: %s", result.get("skipped"))
            # Fresh counts for whatever version is served next.
            with self._lock:
                self.requests.pop(version, None)
                self.errors.pop(version, None)

    @staticmethod
    def _features(served: Any, user: Mapping[str, float]) -> dict[str, Any]:
        """The user fields the version scored with: one value per request, logged once as its
        request row. The item side (the item table's columns and ``genre``) is logged by
        reference, see :meth:`_item_snapshot`."""
        return {name: float(value) for name, value in user.items()}

    def _item_snapshot(self, items: Any) -> ItemSnapshot:
        """The served item table as an :class:`~serving.feedback_rows.ItemSnapshot`: its columns
        (the item fields read at load) and ``genre`` (NaN / None where unknown), for the
        monitor's drift check against the training set. Built once per table."""
        held = self._snapshot
        if held is not None and held[0] is items:
            return held[1]
        columns: dict[str, Any] = {name: items.feature_column(name) for name in items.columns}
        columns["genre"] = Coded(items.genre_codes, items.genres)
        snapshot = ItemSnapshot(np.asarray(items.ids, dtype=np.int64), columns)
        snapshot.digest  # noqa: B018 - hashed here, not on the writer thread's first write
        self._snapshot = (items, snapshot)
        return snapshot

    def _shadow_scores(self, user_id: int, item_ids: np.ndarray) -> tuple[str, np.ndarray] | None:
        alias = self.config.shadow_alias
        if alias is None:
            return None
        try:
            backends, settings = self.model.backends, self.model.settings
            wanted = backends.champion_version(settings, alias)
            # A version the model refused (VersionNotServable) is not loaded again.
            if wanted is None or self.model.is_refused(str(wanted)):
                return None
            if self._shadow is None or self._shadow.version != str(wanted):
                loaded = self.model.load_alias(alias, str(wanted))
                if loaded is None:
                    return None
                prepared = self.model.prepare_servable(loaded)
                if prepared is None:
                    why = self.model.refused_versions[str(loaded.version)]
                    log.error("not scoring in shadow with alias %s: %s", alias, why)
                    return None
                self._shadow = prepared
            return self._shadow.version, self.model.score(self._shadow, user_id, item_ids)
        except Exception:
            log.exception("shadow scoring with alias %s failed", alias)
            return None

    def drain(self, timeout_s: float = 10.0) -> None:
        """Finish queued work and flush the feedback log (tests, shutdown)."""
        done = threading.Event()
        self._submit(done.set)
        done.wait(timeout_s)
        if self.feedback is not None:
            self.feedback.flush()

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish queued work and write all buffered feedback (the server's shutdown)."""
        done = threading.Event()
        try:
            self._queue.put(done.set, timeout=timeout_s)  # waits for room: nothing dropped
        except queue.Full:
            log.warning("serving observer still busy after %.0f s at shutdown", timeout_s)
        else:
            done.wait(timeout_s)
        if self.feedback is not None:
            before = self.feedback.written_rows
            self.feedback.close()
            log.info(
                "feedback: %d rows written (%d at shutdown), %d dropped",
                self.feedback.written_rows,
                self.feedback.written_rows - before,
                self.feedback.dropped_rows,
            )


def observer_from_env(model: Any) -> ServingObserver | None:
    config = ObserverConfig.from_env()
    return ServingObserver(model, config) if config.enabled else None
