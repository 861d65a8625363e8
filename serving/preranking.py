"""The pre-ranking KServe model: one user x N candidate items in, N click scores out.

Served by ``python -m serving.server`` (see :mod:`serving.server`). Request, Open Inference
Protocol v2 JSON, ``POST /v2/models/preranking/infer``::

    {"id": "r1",
     "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [42]},
                {"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [7, 9, 11]}]}

Response: output ``scores`` (FP32, shape ``[N]``, sigmoid of the logits) and
``parameters.model_version``. Requests carry ids, never feature tensors. The same route takes
the v2 binary tensor extension (``Inference-Header-Content-Length``: a JSON header, then the ids
as raw little-endian INT64 bytes, each input declaring its ``binary_data_size``) and answers the
scores as raw FP32 bytes when asked (``parameters.binary_data_output``); the scores are the
JSON answer's, bit for bit. With ``CASCADE_SERVING_PROFILE=N`` one answer in N carries a
``Server-Timing`` header with each stage's wall and CPU time (:mod:`serving.request_profile`).

The server serves versions trained on the cross-statistics engine's training set: an FSCD
ColdPreRanker (with its field encoder) over the ids and engine statistics, whose run names its
source in the param ``cross_source``. Its item table is the source's newest published item
catalogue (ids, and ``item_category`` as the genre). The fields of views keyed by the item alone
(``cross_item``) are read once when the version loads, for every item of the table, and held
with it: they are the store's values at that load until the next version loads. The user and
cross fields (``user_cat_ctr_7d``: the view ``cross_user_cat`` keyed by the user and each
candidate's genre) are read from the online store per request, one batched read per view with
the candidates' keys deduplicated (:mod:`serving.online_fields`, timed in
``cascade_online_feature_read_seconds``); from the local profile's SQLite store the rows read are
held by the reader until the store's data changes (:class:`domains.ctr.online_cross.
OnlineCrossReader`), so a user seen again is read without a query. A field no view serves
comes as one more input named after the field (FP32/FP64/INT64; shape ``[1]`` for a user
field, ``[N]`` otherwise; JSON null: unknown), and a request without one gets a 400 naming it.
A request may send a served field too: its values win.

Any other version (a dense PreRanker, a ColdPreRanker that reads the MovieLens-shaped fields of
:data:`domains.ctr.schema.MODEL_FEATURES`, one whose run names no source) is refused when it
loads (:class:`VersionNotServable`): the refusal is logged once, the served version stays, and
the refused one is not loaded again until the alias moves to another version.

A version is scored by its compiled package (``CompiledColdScorer``: the AOTInductor ``.pt2``
the pipeline's compile gate built and passed for the version's run, downloaded with the version;
item field codes per version, user fields once per request, cross fields once per key), or,
without a package (or with ``CASCADE_SERVING_COMPILED=0``), by the same scorer around the
network's own request call (eager PyTorch). A background thread polls the registry's champion
alias and swaps a new version in without a restart.

Here: the KServe model and its settings. Its inputs are parsed by
:mod:`serving.preranking_inputs`; the v2 codec is :mod:`serving.v2_codec`; the in-memory item
table :mod:`serving.item_table`; the compiled scorer :mod:`serving.cold_scorer`; one served
version, swapped in as one reference, :mod:`serving.served_version`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from kserve import InferRequest, InferResponse, Model
from kserve.errors import InferenceError, InvalidInput, ModelNotReady
from kserve.metrics import PREDICT_HIST_TIME, get_labels
from kserve.protocol.infer_type import InferOutput

from cascade.artifacts import TamperedArtifact
from cascade.config import Settings, load_settings
from domains.ctr.schema import ITEM_GENRE, MODEL_FEATURES
from models.preranking.model import ColdPreRanker, request_fields
from serving.cold_scorer import UserSide
from serving.item_table import ItemTable
from serving.metrics import FEATURE_OVERRIDES, INFERENCE_ERRORS, ONLINE_READ_SECONDS
from serving.online_fields import CrossReader, KeyedColumn, OnlineFieldPlan
from serving.preranking_backends import (
    Backends,
    ChampionModel,
    FeatureStoreBusy,
    VersionNotServable,
    default_backends,
    is_lock_timeout,
)
from serving.preranking_inputs import (
    ID_DATATYPE,
    ITEMS_INPUT,
    USER_INPUT,
    parse_field_inputs,
)
from serving.request_profile import StageClock
from serving.served_version import ServedVersion, freeze_heap
from serving.user_sides import UserSides
from serving.v2_codec import (
    V2Answer,
    binary_header_length,
    decode_v2_request,
    require_v2,
    v2_answer,
)

log = logging.getLogger(__name__)

MODEL_NAME = "preranking"
SCORES_OUTPUT = "scores"

UNSERVED_FIELDS = frozenset(MODEL_FEATURES)
"""The MovieLens-shaped fields of the dense contract: no job writes them and no online store
serves them, so a version that reads any of them is refused."""


@dataclass(kw_only=True)
class ServingConfig:
    """Knobs of the pre-ranking server that are not in :class:`cascade.config.Settings`."""

    max_candidates: int = 10_000
    """Most item ids one request may carry; larger lists get a 400."""
    poll_s: float = 2.0
    """Seconds between checks of the registry's champion alias (``CASCADE_SERVING_POLL_S``)."""
    alias: str = "champion"
    """Registry alias whose version is served."""
    item_batch: int = 5_000
    """Item ids per online-store call while reading the item table's fields at load."""
    use_compiled: bool = True
    """Score an FSCD pre-ranker with its gate-passed compiled package when its run has one
    (``CASCADE_SERVING_COMPILED``: ``1``, ``0`` for eager PyTorch)."""

    def __post_init__(self) -> None:
        if self.max_candidates < 1:
            raise ValueError(
                f"max_candidates must be >= 1, got {self.max_candidates} "
                "(CASCADE_SERVING_MAX_CANDIDATES)"
            )
        if not (self.poll_s > 0 and math.isfinite(self.poll_s)):
            raise ValueError(
                f"poll_s must be a positive number of seconds, got {self.poll_s} "
                "(CASCADE_SERVING_POLL_S)"
            )
        if self.item_batch < 1:
            raise ValueError(f"item_batch must be >= 1, got {self.item_batch}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServingConfig:
        """Defaults, overridden by CASCADE_SERVING_POLL_S, CASCADE_SERVING_MAX_CANDIDATES and
        CASCADE_SERVING_COMPILED."""
        serving = load_settings(env).serving
        return cls(
            poll_s=serving.poll_s,
            max_candidates=serving.max_candidates,
            use_compiled=serving.compiled,
        )


def _same_value(stored: float, sent: float) -> bool:
    """Whether a request's value is the store's (both unknown counts as the same)."""
    return (math.isnan(stored) and math.isnan(sent)) or stored == sent


@dataclass(frozen=True, slots=True)
class Scored:
    """One request's scores and the features they were computed with (for the feedback log)."""

    scores: np.ndarray
    """float32 ``[N]`` in (0, 1)."""
    user: Mapping[str, float]
    """The values of the version's user fields it scored with (read online or sent)."""
    rows: np.ndarray
    """Each candidate's row in the served item table (-1: unknown item)."""


def _user_values(served: ServedVersion, given: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The user fields of ``served`` among ``given`` (each ``[1]``), as the scorer takes them
    and the feedback log keeps them."""
    return {
        name: float(np.asarray(given[name], dtype=np.float64).reshape(-1)[0])
        for name, kind in served.request_fields.items()
        if kind == "user" and name in given
    }


class PreRankingModel(Model):
    """KServe model ``preranking`` with hot swap of the registry's champion."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        config: ServingConfig | None = None,
        backends: Backends | None = None,
        name: str = MODEL_NAME,
    ) -> None:
        super().__init__(name)
        self.settings = settings or load_settings()
        self.config = config or ServingConfig.from_env()
        self.backends = backends or default_backends()
        self._cross_reader: CrossReader | None = None
        self._cross_reader_opened = False
        self._read_seconds: dict[str, Any] = {}
        """Per view: the labelled child of ONLINE_READ_SECONDS (a label lookup per read costs)."""
        self._served: ServedVersion | None = None
        self._refresh_lock = threading.Lock()
        self._predict_seconds = PREDICT_HIST_TIME.labels(**get_labels(name))
        self.profile = self.settings.serving.profile
        """Time each stage of one infer request in this many (0: none) into its answer's
        ``Server-Timing`` (``CASCADE_SERVING_PROFILE``, :mod:`serving.request_profile`)."""
        self._unprofiled = 0
        """Infer requests since the last one timed."""
        self.feature_store_timeouts = 0
        """Requests answered 503 because the online store was locked or timed out."""
        self.feature_overrides = 0
        """Requests that carried a user field's value other than the online store's (scored
        with it, logged with the store's)."""
        self.refused_versions: dict[str, str] = {}
        """``{version: why}`` of the versions refused at load (:class:`VersionNotServable`,
        :meth:`prepare_servable`, or files that are not the signed ones): not fetched again
        while the alias stays on them and their registry record is unchanged
        (:meth:`is_refused`)."""
        self._refused_records: dict[str, str | None] = {}
        """``{version: record digest}`` of each refusal (``Backends.version_record``)."""
        self._records_read: dict[str, float] = {}
        """``{version: monotonic time}`` of the last read of a refused version's record."""
        self._alias_at: str | None = None
        """The version the served alias pointed at on the last refresh."""
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        # Feedback log, shadow scoring, automatic rollback: off unless enabled by environment.
        from serving.shadow import observer_from_env

        self.observer = observer_from_env(self)

    # Lifecycle -------------------------------------------------------------------------------

    @property
    def served_version(self) -> str | None:
        served = self._served
        return served.version if served else None

    def start(self) -> None:
        """Start polling the registry. Unlike KServe's default, this does not mark us ready."""
        if self._poller and self._poller.is_alive():
            return
        self._stop.clear()
        self._poller = threading.Thread(
            target=self._poll_forever, name="champion-poll", daemon=True
        )
        self._poller.start()

    def stop(self) -> None:
        """Stop polling; write the buffered feedback (KServe calls this on shutdown)."""
        self._stop.set()
        self.ready = False
        if self.observer is not None:
            self.observer.close()

    def load(self) -> bool:
        """Load the champion now if there is one; True when a version is being served."""
        self.refresh()
        return self.ready

    def _poll_forever(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                self.refresh()
                if last_error:
                    log.info("champion refresh works again")
                last_error = ""
            except Exception as exc:
                # The registry or store being down must not kill the poller: keep serving the
                # version we have and try again on the next tick. The traceback once, then a
                # line per tick, so a registry outage does not flood the log.
                error = f"{type(exc).__name__}: {exc}"
                if error != last_error:
                    log.exception("champion refresh failed; serving %s", self.served_version)
                else:
                    log.warning("champion refresh still failing: %s", error[:200])
                last_error = error
            self._stop.wait(self.config.poll_s)

    def refresh(self) -> bool:
        """Swap in the champion if its version differs from the served one; True if swapped.

        A version that cannot be served (:class:`VersionNotServable`, files that are not the
        signed ones) is refused: logged once, remembered in :attr:`refused_versions` and not
        fetched again while the alias stays on it and its registry record is unchanged; the
        served version stays. Any other failure (registry, catalogue, online
        store) raises, and the poller tries again on its next tick."""
        with self._refresh_lock:
            wanted = self.backends.champion_version(self.settings, self.config.alias)
            if wanted is None:
                if self._served is None:
                    log.info("no '%s' alias in the registry yet; not ready", self.config.alias)
                return False
            if str(wanted) != self._alias_at:  # the alias moved: refusals are judged afresh
                if self._alias_at is not None:
                    self.forget_refusals()
                self._alias_at = str(wanted)
            if self._served is not None and str(wanted) == self._served.version:
                return False
            if self.is_refused(str(wanted)):
                return False
            log.info("loading %s version %s (serving %s)", self.name, wanted, self.served_version)
            loaded = self.load_alias(self.config.alias, str(wanted))
            if loaded is None:
                return False
            served = self.prepare_servable(loaded)
            if served is None:
                log.error(
                    "refusing %s version %s: %s; still serving %s",
                    self.name,
                    loaded.version,
                    self.refused_versions[str(loaded.version)],
                    self.served_version,
                )
                return False
            previous = self.served_version
            # One reference assignment: a request that already read the old ServedVersion
            # finishes on it, every later request sees the new one.
            self._served = served
            if previous is None:
                freeze_heap()
            self.ready = True
            log.info("serving %s version %s (was %s)", self.name, served.version, previous)
            return True

    def refuse(self, version: str, why: str) -> None:
        """Remember that ``version`` cannot be served (``why``), with its registry record."""
        self.refused_versions[version] = why
        self._refused_records[version] = self._record_of(version)

    def _record_of(self, version: str) -> str | None:
        try:
            return self.backends.version_record(self.settings, version)
        except Exception as exc:  # the registry is down: the version number alone keys it
            log.warning("cannot read version %s's registry record: %s", version, exc)
            return None

    def is_refused(self, version: str) -> bool:
        """Whether ``version`` was refused and its registry record is still the one refused
        (one metadata read instead of downloading and hashing its files again, every tick of
        every worker). A changed record (an operator signed the version) is tried again."""
        if version not in self.refused_versions:
            return False
        recorded = self._refused_records.get(version)
        if recorded is None:
            return True
        # At most one read a poll interval: the shadow alias asks on every request.
        now = time.monotonic()
        if now - self._records_read.get(version, -math.inf) < self.config.poll_s:
            return True
        self._records_read[version] = now
        if self._record_of(version) == recorded:
            return True
        log.info("%s version %s changed in the registry since it was refused; checking it again",
                 self.name, version)  # fmt: skip
        self.refused_versions.pop(version, None)
        self._refused_records.pop(version, None)
        self._records_read.pop(version, None)
        return False

    def forget_refusals(self) -> None:
        """Judge every version afresh (the served alias moved)."""
        self.refused_versions.clear()
        self._refused_records.clear()
        self._records_read.clear()

    def load_alias(self, alias: str, wanted: str) -> ChampionModel | None:
        """The version behind ``alias`` (``wanted`` when the alias was read), or None: nothing
        there, or a version the platform did not sign or whose files are not the signed ones
        (:mod:`cascade.signing`; checked before anything is downloaded or loaded). A refusal is
        logged once and remembered in :attr:`refused_versions` (not fetched again while an
        alias stays on it); the served version stays."""
        try:
            return self.backends.load_champion(self.settings, alias)
        except TamperedArtifact as refused:
            self.refuse(wanted, str(refused))
            log.error("refusing %s version %s (alias %s): %s; still serving %s", self.name,
                      wanted, alias, refused, self.served_version)  # fmt: skip
            return None

    def _cross(self) -> CrossReader | None:
        if not self._cross_reader_opened:
            self._cross_reader = self.backends.open_cross_reader(self.settings)
            self._cross_reader_opened = True
        return self._cross_reader

    def _online_plan(
        self, network: ColdPreRanker, version: str
    ) -> tuple[OnlineFieldPlan, OnlineFieldPlan]:
        """``(per request, per item)``: the fields beyond the ids that the online store
        serves, those of views keyed by the item alone read once for the item table
        (:meth:`_with_item_fields`), the others per request; the requests carry the rest."""
        needs = request_fields(network)
        if not needs:
            return OnlineFieldPlan(()), OnlineFieldPlan(())
        reader = self._cross()
        sources = reader.sources(list(needs)) if reader is not None else {}
        plan = OnlineFieldPlan.build(needs, sources)
        per_request, per_item = plan.split_item_reads()
        if per_request.reads:
            log.info(
                "version %s: fields read from the online store per request: %s",
                version,
                "; ".join(f"{r.view} ({', '.join(r.fields)})" for r in per_request.reads),
            )
        rest = [name for name in needs if name not in plan.fields]
        if rest:
            log.warning(
                "version %s: no online view serves fields %s; every request must carry them",
                version,
                rest,
            )
        return per_request, per_item

    def _cross_source(self, loaded: ChampionModel) -> str:
        """The cross-statistics source whose training set ``loaded`` was trained on; raises
        :class:`VersionNotServable` naming the version and what to do for any version that is
        not one of the engine's (a dense PreRanker, a ColdPreRanker reading the MovieLens-shaped
        fields, a run that names no source)."""
        network = loaded.model
        version, run = loaded.version, loaded.run_id
        todo = (
            "train one with the ctr_preranking pipeline (it trains the FSCD pre-ranker) and "
            "promote it, or point the champion alias back at a version it trained "
            "(cascade rollback --model preranking)"
        )
        if not isinstance(network, ColdPreRanker):
            raise VersionNotServable(
                f"model version {version} (run {run}) is a {type(network).__name__}; the server "
                "serves only ColdPreRankers trained on the cross-statistics engine's training "
                f"set: {todo}"
            )
        unserved = [name for name in network.fields if name in UNSERVED_FIELDS]
        if unserved:
            raise VersionNotServable(
                f"model version {version} (run {run}) reads the MovieLens-shaped fields "
                f"{unserved}, which no job writes and no online store serves any more: {todo}"
            )
        source = self.backends.version_source(self.settings, str(run))
        if source is None:
            raise VersionNotServable(
                f"model version {version}: its run {run} names no cross-statistics source (run "
                "param cross_source), so there is no item catalogue to serve it from: " + todo
            )
        return source

    def _catalogue_items(self, source: str, version: str) -> ItemTable:
        """A version's item table: the ids of ``source``'s newest published item catalogue,
        each with its ``item_category`` as its genre; no item field yet."""
        frame = self.backends.item_catalogue(self.settings, source)
        if frame is None:
            raise FileNotFoundError(
                f"version {version} was trained on the cross statistics of {source!r}, but the "
                f"lake has no published item catalogue of {source!r} (features/ctr_catalogue/"
                f"{source} with a passed gate); run the ctr_cross pipeline for {source!r}"
            )
        table = frame.set_index("item_id")[["item_category"]].rename(
            columns={"item_category": ITEM_GENRE}
        )
        return ItemTable.from_frame(table, columns=())

    def _with_item_fields(self, items: ItemTable, plan: OnlineFieldPlan, version: str) -> ItemTable:
        """``items`` with the fields of ``plan`` (views keyed by the item alone) read from the
        online store for every item, ``ServingConfig.item_batch`` items per read.

        The values are those the store held when the version loaded (the view's ttl applied
        then); they are not read again until another version loads, so a materialization in
        between reaches the requests with the next version only. An item outside the table
        gets NaN (unknown) for these fields."""
        reader = self._cross()
        if reader is None:  # a plan is only built with a reader
            raise RuntimeError("the online cross reader is gone")
        values = plan.item_values(
            reader,
            item_ids=items.ids.to_numpy(),
            genre_codes=items.genre_codes,
            genres=items.genres,
            batch=self.config.item_batch,
        )
        known = np.zeros(len(items.ids), dtype=bool)
        for column in values.values():
            known |= np.isfinite(column)
        log.info(
            "version %s: item fields read once, at load, for %d items (%d with a value): %s",
            version,
            len(items.ids),
            int(known.sum()),
            "; ".join(f"{r.view} ({', '.join(r.fields)})" for r in plan.reads),
        )
        return items.with_columns(values)

    def prepare_servable(self, loaded: ChampionModel) -> ServedVersion | None:
        """:meth:`_prepare`, or None for a version that cannot be served
        (:class:`VersionNotServable`): the refusal is remembered in :attr:`refused_versions`,
        which every alias this model loads (the served one, the shadow's) checks before
        loading a version again; the caller logs it. Other failures raise."""
        try:
            return self._prepare(loaded)
        except VersionNotServable as refused:
            self.refuse(str(loaded.version), str(refused))
            return None

    def _prepare(self, loaded: ChampionModel) -> ServedVersion:
        """The :class:`ServedVersion` of ``loaded``: refused (:class:`VersionNotServable`)
        unless it is a version of the cross-statistics engine; its item table is its source's
        item catalogue with the item fields read once."""
        version = str(loaded.version)
        source = self._cross_source(loaded)
        network = loaded.model
        assert isinstance(network, ColdPreRanker)  # checked by _cross_source
        network.eval()
        online, per_item = self._online_plan(network, version)
        items = self._catalogue_items(source, version)
        if per_item.reads:
            items = self._with_item_fields(items, per_item, version)
        log.info(
            "version %s: %d items held in memory (item catalogue of %s)",
            version,
            len(items.ids),
            source,
        )
        return ServedVersion(
            network=network,
            version=version,
            run_id=str(loaded.run_id),
            items=items,
            encoder=getattr(loaded, "encoder", None),
            compiled=getattr(loaded, "compiled", None),
            compiled_reason=getattr(loaded, "compiled_reason", ""),
            use_compiled=self.config.use_compiled,
            online=online,
        )

    # Inference -------------------------------------------------------------------------------

    def get_input_types(self) -> list[dict[str, Any]]:
        served = self._served
        fields = served.request_fields if served is not None else {}
        return [
            {"name": USER_INPUT, "datatype": ID_DATATYPE, "shape": [1]},
            {"name": ITEMS_INPUT, "datatype": ID_DATATYPE, "shape": [-1]},
            *(
                {"name": name, "datatype": "FP32", "shape": [1] if kind == "user" else [-1]}
                for name, kind in fields.items()
            ),
        ]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": SCORES_OUTPUT, "datatype": "FP32", "shape": [-1]}]

    def score(
        self,
        served: ServedVersion,
        user_id: int,
        item_ids: np.ndarray,
        user_out: dict[str, float] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Scores in ``(0, 1)`` for one user and N candidates, with ``served``'s network.

        ``user_out``, when given, receives the user fields as scored; ``extra``: the
        values of ``served.request_fields`` the request carries."""
        scored = self.score_request(served, user_id, item_ids, extra)
        if user_out is not None:
            user_out.update(scored.user)
        return scored.scores

    def score_request(
        self,
        served: ServedVersion,
        user_id: int,
        item_ids: np.ndarray,
        extra: Mapping[str, np.ndarray] | None = None,
        clock: StageClock | None = None,
        *,
        held: bool = True,
    ) -> Scored:
        """:meth:`score` with the features it used: the fields of ``served.online`` the request
        does not carry read from the online store, one batched read per view
        (:mod:`serving.online_fields`); the item fields from the item table; the user side of
        the network once. ``extra``: the request's values of ``served.request_fields``
        (InvalidInput naming a missing one that the server does not supply). ``held=False``
        reads and encodes per request even where the user's share could be held
        (:mod:`serving.user_sides`): the full path, to compare the two."""
        if served.request_fields:
            absent = [n for n in served.required_fields if n not in (extra or {})]
            if absent:
                raise InvalidInput(
                    f"missing inputs {absent}: model version {served.version} reads these fields"
                )
        items = served.items
        rows = items.rows(item_ids)
        sent = extra or {}
        if held and served.user_sides is not None and not sent:
            side = self._user_side(served, served.user_sides, user_id)
            if side is not None:
                codes = items.codes(rows)
                if clock is not None:
                    clock.lap("features")
                logits = served.scorer.side_logits(side, rows, item_ids, codes, clock)
                return self._scored(served, logits, item_ids, rows, dict(side.values), clock)
        keyed: dict[str, KeyedColumn] = {}
        if served.online.reads:
            codes = items.codes(rows)
            extra = {
                **self._online_values(served, user_id, item_ids, codes, extra, keyed),
                **(extra or {}),
            }
        user = _user_values(served, extra or {})
        if served.online.reads and any(n in served.online.fields for n in sent):
            user.update(self._store_user_values(served, user_id, item_ids, codes, sent, user))
        if clock is not None:
            clock.lap("features")
        logits = served.scorer.logits(
            user_id, rows, item_ids, extra=extra, keyed=keyed, clock=clock
        )
        return self._scored(served, logits, item_ids, rows, user, clock)

    def _scored(
        self,
        served: ServedVersion,
        logits: torch.Tensor,
        item_ids: np.ndarray,
        rows: np.ndarray,
        user: dict[str, float],
        clock: StageClock | None,
    ) -> Scored:
        scores = torch.sigmoid(logits.detach().float()).reshape(-1).numpy()
        if scores.shape[0] != len(item_ids) or not np.isfinite(scores).all():
            raise InferenceError(
                f"model version {served.version} returned {scores.shape[0]} scores with "
                f"non-finite values for {len(item_ids)} candidates; roll back the champion alias"
            )
        if clock is not None:
            clock.lap("score")
        return Scored(scores=scores.astype(np.float32, copy=False), user=user, rows=rows)

    def _online_values(
        self,
        served: ServedVersion,
        user_id: int,
        item_ids: np.ndarray,
        codes: np.ndarray,
        given: Mapping[str, np.ndarray] | None,
        keyed: dict[str, KeyedColumn] | None = None,
        expires: list[int] | None = None,
    ) -> dict[str, np.ndarray]:
        """The values of ``served.online``'s fields for this request from the online store
        (fields ``given`` in the request are not read); each view's read is timed. ``keyed``
        receives the per-candidate ones per distinct key (for the scorer's encoding)."""
        reader = self._cross()
        if reader is None:  # a plan is only built with a reader
            raise RuntimeError("the online cross reader is gone")
        try:
            return served.online.values(
                reader,
                user_id=user_id,
                item_ids=item_ids,
                genre_codes=codes,
                genres=served.items.genres,
                given=given,
                timed=self._observe_read,
                keyed=keyed,
                expires=expires,
            )
        except Exception as exc:
            if is_lock_timeout(exc):
                raise FeatureStoreBusy(self.name) from exc
            raise

    def _user_side(self, served: ServedVersion, sides: UserSides, user_id: int) -> UserSide | None:
        """The user's :class:`~serving.cold_scorer.UserSide` for ``served``: the one held while
        the store's stamp is the same and no value has aged out, else built from one read per
        view of the user's fields for every genre and held. None when the reader cannot
        stamp its answers (a store that is not packed): the request takes the full path."""
        from domains.ctr.online_packed import micros  # Feast's modules: imported with the reader

        reader = self._cross()
        stamp_of = getattr(reader, "stamp", None)
        if stamp_of is None:
            return None
        with reader.one_version():  # type: ignore[union-attr]
            stamp = stamp_of(sides.views)
            if stamp is None:
                return None
            now = micros(reader.clock())  # type: ignore[union-attr]
            side = sides.get(user_id, stamp, now)
            if side is not None:
                return side
            genres = len(served.items.genres)
            codes = np.append(np.arange(genres, dtype=np.int64), -1)  # each genre, and none
            keyed: dict[str, KeyedColumn] = {}
            expires: list[int] = []
            values = self._online_values(
                served, user_id, np.zeros(genres + 1, np.int64), codes, None, keyed, expires
            )
            user = _user_values(served, values)
            side = served.scorer.user_side(user_id, genres, values, keyed, user)
            sides.put(user_id, stamp, min(expires, default=None), side)
            return side

    def _store_user_values(
        self,
        served: ServedVersion,
        user_id: int,
        item_ids: np.ndarray,
        codes: np.ndarray,
        request_values: Mapping[str, np.ndarray],
        scored_user: Mapping[str, float],
    ) -> dict[str, float]:
        """The online store's values of the user fields the request carried (``request_values``)
        although the server reads them from the store. The request is scored with its own
        values (``scored_user``), but those are what a client chose: the feedback log keeps the
        store's as the request's observed features. A value other than the store's is an
        override, counted in :attr:`feature_overrides`. One extra read, only for requests
        that carry such fields."""
        names = [n for n in scored_user if n in served.online.fields and n in request_values]
        if not names:
            return {}
        # Every other field counts as given: only the overridden ones are read.
        others = {n: np.empty(0) for n in served.online.fields if n not in names}
        stored = self._online_values(served, user_id, item_ids, codes, others)
        values = {n: float(np.asarray(stored[n], dtype=np.float64).reshape(-1)[0]) for n in names}
        differ = sorted(n for n in names if not _same_value(values[n], scored_user[n]))
        if differ:
            self.feature_overrides += 1
            FEATURE_OVERRIDES.labels(model_name=self.name).inc()
            if self.feature_overrides == 1 or self.feature_overrides % 1000 == 0:
                log.warning(
                    "requests overrode the online store's %s (%d so far); the feedback log "
                    "keeps the store's values",
                    differ,
                    self.feature_overrides,
                )
        return values

    def _observe_read(self, view: str, seconds: float) -> None:
        child = self._read_seconds.get(view)
        if child is None:
            child = self._read_seconds[view] = ONLINE_READ_SECONDS.labels(
                model_name=self.name, view=view
            )
        child.observe(seconds)

    async def infer_json(self, body: bytes) -> bytes:
        """A v2 JSON request body in, the v2 JSON response body out (:meth:`infer_v2` without
        request headers: no binary inputs; the answer's body only)."""
        return (await self.infer_v2(body, ())).body

    async def infer_v2(self, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> V2Answer:
        """A v2 request body (JSON, or the binary tensor extension when ``headers`` carry
        ``Inference-Header-Content-Length``) in, the v2 answer out (scores as raw FP32 bytes
        when the request asks for them in binary: ``parameters.binary_data_output``, or
        ``binary_data`` on the ``scores`` output). ``headers``: the request's, names in lower
        case (as the ASGI server gives them). With :attr:`profile` each stage is timed into the
        answer's ``Server-Timing`` (:mod:`serving.request_profile`).

        Serves ``POST /v2/models/<name>/infer`` in :mod:`serving.server` in place of KServe's
        generic route (see :func:`serving.v2_codec.decode_v2_json` for why): the same checks and
        answers as :meth:`predict` on ``decode_v2_json(body)`` (a test holds them equal), without
        building KServe's request and response objects. Of ``Model.__call__`` it keeps what this
        model uses: pre- and postprocess are the identity here, so only KServe's predict latency
        histogram is observed (its three histograms, with their label lookups and coroutine
        checks, cost ~0.1 ms a request). Raises MalformedRequest (422), InvalidInput (400),
        ModelNotReady (503) or InferenceError (500).
        """
        clock = self._stage_clock()
        request = decode_v2_request(body, binary_header_length(headers))
        if clock is not None:
            clock.lap("parse")
        with self._predict_seconds.time():
            served = self._serving()
            user_id, item_ids, extra = parse_field_inputs(
                request.inputs,
                max_candidates=self.config.max_candidates,
                fields=served.request_fields,
                optional=served.served_fields,
            )
            if clock is not None:
                clock.lap("validate")
            response_id, server_id, scores = self._infer(
                served, user_id, item_ids, request.id, extra, clock
            )
        answer = v2_answer(
            response_id=response_id,
            model_name=self.name,
            model_version=served.version,
            outputs=[
                {"name": SCORES_OUTPUT, "shape": [len(scores)], "datatype": "FP32", "data": scores}
            ],
            parameters={
                "model_version": served.version,
                "run_id": served.run_id,
                "request_id": server_id,
            },
            request=request,
        )
        if clock is None:
            return answer
        clock.lap("respond")
        return V2Answer(answer.body, answer.json_length, clock.header_value())

    def _stage_clock(self) -> StageClock | None:
        """A clock for this request when it is the one in :attr:`profile` to time."""
        if not self.profile:
            return None
        self._unprofiled += 1
        if self._unprofiled < self.profile:
            return None
        self._unprofiled = 0
        return StageClock()

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        payload = require_v2(payload, self.name)
        served = self._serving()
        user_id, item_ids, extra = parse_field_inputs(
            payload.inputs or [],
            max_candidates=self.config.max_candidates,
            fields=served.request_fields,
            optional=served.served_fields,
        )
        response_id, server_id, scores = self._infer(served, user_id, item_ids, payload.id, extra)
        return InferResponse(
            response_id=response_id,
            model_name=self.name,
            model_version=served.version,
            infer_outputs=[
                InferOutput(name=SCORES_OUTPUT, shape=[len(scores)], datatype="FP32", data=scores)
            ],
            parameters={
                "model_version": served.version,
                "run_id": served.run_id,
                "request_id": server_id,
            },
        )

    def _serving(self) -> ServedVersion:
        served = self._served
        if served is None:
            raise ModelNotReady(self.name, "No champion version has been loaded yet.")
        return served

    def _infer(
        self,
        served: ServedVersion,
        user_id: int,
        item_ids: np.ndarray,
        request_id: str | None,
        extra: Mapping[str, np.ndarray] | None = None,
        clock: StageClock | None = None,
    ) -> tuple[str, str, np.ndarray]:
        """Score, count and log one request: ``(response id, request id, scores)``.

        The request id is the server's own, generated here: the feedback log keys the
        request's rows by it and clicks join on it, so a client cannot name (or collide with)
        another request's rows. The response carries it as the ``request_id`` parameter; its
        ``id`` echoes the client's id (the v2 protocol's correlation id), which the feedback
        log keeps only as the untrusted ``client_request_id``.

        On the event loop: ~0.3 ms of CPU, all of it holding the GIL anyway; a hop to a thread
        (asyncio.to_thread) cost ~0.2 ms more CPU per request in wake-ups and GIL hand-offs,
        and let concurrent requests interleave instead of finishing in order. The online
        store's SQLite read blocks only while a materialization commits.
        """
        try:
            scored = self.score_request(served, user_id, item_ids, extra, clock)
        except FeatureStoreBusy as exc:
            # Not the model's error: never counted toward the automatic rollback.
            INFERENCE_ERRORS.labels(model_name=self.name, kind="feature_store_timeout").inc()
            self.feature_store_timeouts += 1
            if self.observer is not None:
                self.observer.feature_store_timeout(served)
            total = self.feature_store_timeouts
            if total == 1 or total % 100 == 0:
                log.warning("feature store busy (%d so far): %s", total, exc.__cause__)
            raise
        except Exception:
            INFERENCE_ERRORS.labels(model_name=self.name, kind="model").inc()
            if self.observer is not None:
                self.observer.failed(served)
            raise
        server_id = os.urandom(16).hex()  # 128 random bits, as a uuid4's hex, in a fifth the time
        if self.observer is not None:  # counted and buffered now; written off the response path
            self.observer.observed(
                served, server_id, user_id, item_ids, scored.scores, scored.user,
                client_request_id=request_id,
            )  # fmt: skip
        if clock is not None:
            clock.lap("feedback")
        return request_id or server_id, server_id, scored.scores
