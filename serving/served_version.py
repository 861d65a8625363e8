"""One served model version of the pre-ranker: its network, its in-memory item table and the
scorer built for both, swapped in by the server as one reference (hot swap without a restart)."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from cascade.compiled_packages import load_package
from models.preranking.fields import FieldEncoder
from models.preranking.model import ColdPreRanker, request_fields
from serving.cold_scorer import CompiledColdScorer, eager_run
from serving.item_table import ItemTable
from serving.online_fields import OnlineFieldPlan
from serving.user_sides import UserSides, user_side_views

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ServedVersion:
    """Everything one model version needs; swapped in as one reference."""

    network: ColdPreRanker
    version: str
    run_id: str
    items: ItemTable
    encoder: FieldEncoder | None = None
    """The network's field encoder (required: a version without one is refused)."""
    compiled: Path | None = None
    """The version's AOTInductor package (gate-passed), None if none."""
    compiled_reason: str = ""
    """Why there is no ``compiled`` package (logged when the version is served eagerly)."""
    use_compiled: bool = True
    """Score with ``compiled`` when there is one (``CASCADE_SERVING_COMPILED=0``: never)."""
    online: OnlineFieldPlan = field(default_factory=lambda: OnlineFieldPlan(()))
    """The fields of :attr:`request_fields` the server reads from the online store per request
    (one batched read per view); a request may still carry them (its values win)."""
    scorer: CompiledColdScorer = field(init=False)
    """The network with the item side encoded for ``items`` (built here, so a version and its
    item codes are swapped in together): its compiled package, or its own request call."""
    backend: str = field(init=False)
    """``compiled`` (the package) or ``eager`` (the network's request call, eager PyTorch)."""
    request_fields: dict[str, str] = field(init=False)
    """``{name: kind}`` of the fields the network reads beyond the ids (the statistics of its
    field set): every request carries them as inputs of that name, one value for a user field,
    one per candidate otherwise; those in :attr:`online` may be left out (the server reads
    them), and so may the item fields the item table holds (:attr:`table_fields`)."""
    user_sides: UserSides | None = field(init=False)
    """Each user's share of the network's inputs, held between requests, when every field the
    version reads beyond the ids is the user's or a user x genre cross read online
    (:mod:`serving.user_sides`); None otherwise."""
    table_fields: frozenset[str] = field(init=False)
    """The fields of :attr:`request_fields` whose values the item table holds (read from the
    online store once, when the version loaded); a request may still carry them."""

    def __post_init__(self) -> None:
        if not isinstance(self.network, ColdPreRanker):
            raise ValueError(
                f"version {self.version} is a {type(self.network).__name__}; only a "
                "ColdPreRanker is served"
            )
        if self.encoder is None:
            raise ValueError(
                f"version {self.version} is a ColdPreRanker without its field encoder; "
                "load it with models.preranking.inference.load_version"
            )
        needs = request_fields(self.network)
        genres = np.array([*self.items.genres, None], dtype=object)
        genre_names = genres[self.items.genre_codes].tolist()  # code -1: the trailing None
        table = (self.items.ids.to_numpy(), self.items.dense, genre_names, self.items.columns)
        scorer = CompiledColdScorer(eager_run(self.network), self.network, self.encoder, *table)
        backend = "eager"
        reason = self.compiled_reason or "no compiled package"
        if not self.use_compiled:
            reason = "CASCADE_SERVING_COMPILED=0"
        elif self.compiled is not None:
            try:
                compiled = CompiledColdScorer(
                    load_package(self.compiled), self.network, self.encoder, *table
                )
                compiled.check_against(scorer)
                scorer, backend, reason = compiled, "compiled", ""
            except Exception as exc:  # a package of another torch build, a broken file
                reason = f"{self.compiled.name} not used: {type(exc).__name__}: {exc}"
        if reason:
            log.warning("version %s: scoring with eager PyTorch: %s", self.version, reason)
        else:
            log.info("version %s: scoring with its compiled package", self.version)
        object.__setattr__(self, "scorer", scorer)
        object.__setattr__(self, "backend", backend)
        stray = sorted(self.online.fields - set(needs))
        if stray:
            raise ValueError(
                f"version {self.version}: fields {stray} are planned as online reads but the "
                f"network does not read them (it reads {sorted(needs)} beyond the ids)"
            )
        object.__setattr__(self, "request_fields", needs)
        held = frozenset(n for n, k in needs.items() if k == "item" and n in self.items.columns)
        object.__setattr__(self, "table_fields", held)
        views = user_side_views(
            self.online, keyed_cross=scorer.keyed_cross, required=self.required_fields
        )
        object.__setattr__(self, "user_sides", UserSides(views) if views else None)

    @cached_property
    def served_fields(self) -> frozenset[str]:
        """The fields of :attr:`request_fields` the server supplies: read from the online
        store per request, or held by the item table."""
        return self.online.fields | self.table_fields

    @cached_property
    def required_fields(self) -> dict[str, str]:
        """``{name: kind}`` of :attr:`request_fields` every request must carry: those the
        server does not supply (:attr:`served_fields`)."""
        served = self.served_fields
        return {n: k for n, k in self.request_fields.items() if n not in served}


_heap_frozen = False


def freeze_heap() -> None:
    """Once per process, when the first version is served: move every object alive now (the
    imported libraries, the loaded model: ~5 x 10^5 objects) out of the garbage collector's
    reach (``gc.freeze``). A full collection otherwise walks all of them again and again, a
    pause of tens of milliseconds (up to 300 ms seen) on whichever requests are in flight.
    No ``gc.collect()`` first: walking them once more holds the GIL for ~0.5 s while the
    server already answers health checks; what garbage gets frozen with them is a one-off."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()
