"""The promotion gate every registered model goes through.

A trained model becomes a new version of its registered model with the ``challenger`` alias;
``champion`` moves to it only when

- the compile gate passed, where the pipeline has a compile step
  (:attr:`~cascade.pipeline_spec.Promotion.requires_compile_gate`: a missing report refuses);
- it is not worse than the champion on :attr:`~cascade.pipeline_spec.Promotion.metric` by more
  than the rule's tolerance, in the rule's direction. The caller scores both versions
  (:data:`Score`), on the same held-out rows wherever the two models can read the same rows;
- it beats the caller's model-free baseline (e.g. item popularity), when the caller gives one
  (:class:`Baseline`): a model no better than counting clicks is not worth serving, whether or
  not there is a champion;
- the champion is still the version the decision was made against: the alias is read again
  right before it moves, under the registry's alias lock (:mod:`cascade.alias_lock`, which
  rollbacks hold too), and a champion that changed meanwhile is left alone (the decision says
  why, and is not stored, so registering again decides against the new champion).

Where the pipeline compiles, :func:`register_and_promote` refuses to register at all without
the compile step's report (:class:`CompileReportMissing`): the register step ran before, or
without, its compile step, and a stored refusal would outlive the report written later.

Every decision is signed (:mod:`cascade.signing`) when the caller hands over the platform's
signing key: the version's file digests, the compile gate's verdict and the decision, before
any alias moves, so the servers, which load only signed versions, never see an alias on a
version the gate has not signed.

The first version is promoted when its compile gate passed. Every refusal is stated in the
decision's ``reasons``. A repeated registration of the same training run returns the decision
stored on its version instead of registering again.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cascade.alias_lock import alias_lock
from cascade.config import Settings
from cascade.errors import NotReady
from cascade.pipeline_spec import Promotion
from cascade.registry import (
    CHALLENGER,
    CHAMPION,
    DECISION_TAG,
    PREVIOUS_CHAMPION_TAG,
    ensure_registered_model,
    version_by_alias,
    version_of_run,
)
from cascade.signing import sign_version
from cascade.tracking_auth import PROMOTER, acting_as

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Scores:
    """Challenger and champion on the promotion metric, and which rows they were scored on."""

    challenger: float
    champion: float
    rows: str
    """Said in a refusal, e.g. ``the same 600 held-out rows``."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Recorded in the comparison beside the scores (row counts and the like)."""


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """A model-free baseline the challenger must beat (strictly, higher is better)."""

    name: str
    """Said in a refusal, e.g. ``item popularity``."""
    metric: str
    challenger: float
    baseline: float
    rows: str

    def verdict(self) -> dict[str, Any]:
        """The record kept in the decision; ``reason`` when the challenger does not beat it."""
        passed = self.challenger > self.baseline
        record: dict[str, Any] = {
            "name": self.name,
            "metric": self.metric,
            "challenger": self.challenger,
            "baseline": self.baseline,
            "rows": self.rows,
            "passed": passed,
        }
        if not passed:
            record["reason"] = (
                f"challenger {self.metric} {self.challenger:.4f} does not beat the {self.name} "
                f"baseline's {self.baseline:.4f} on {self.rows}"
            )
        return record


Score = Callable[[Any], Scores]
"""Scores both versions; called with the champion's ``ModelVersion``."""


@dataclass(frozen=True, kw_only=True)
class NewVersion:
    """What to register: the training run and where its model is."""

    name: str
    """The registered model."""
    model_description: str
    """The registered model's description, when it is created."""
    run_id: str
    source: str
    tags: Mapping[str, str]
    description: str
    model_id: str | None = None
    """MLflow 3's logged model id (``m-...``) the version links to, if any."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the gate decided for one version."""

    version: str
    promoted: bool
    champion_version: str | None
    """The champion after the decision."""
    previous_champion: str | None
    """The champion the decision was made against (None for the first version)."""
    compared_with: Any | None
    """The champion's ``ModelVersion`` when the two were scored, else None."""
    comparison: dict[str, Any] | None
    reasons: list[str]
    champion_moved: bool = False
    """The champion changed between the decision and the move: the alias stayed."""
    baseline: dict[str, Any] | None = None
    """:meth:`Baseline.verdict` when the caller gave a baseline."""

    def record(self) -> dict[str, Any]:
        """The fields every registration report carries (JSON-able)."""
        return {
            "version": self.version,
            "promoted": self.promoted,
            "champion_version": self.champion_version,
            "previous_champion": self.previous_champion,
            "comparison": self.comparison,
            "baseline": self.baseline,
            "reasons": self.reasons,
        }


def compare(promotion: Promotion, scores: Scores, *, champion: str) -> dict[str, Any]:
    """The comparison record: ``passed`` when the challenger is not worse than ``champion`` (a
    version number) by more than the tolerance in the rule's direction; ``reason`` when not."""
    new, old, tolerance = scores.challenger, scores.champion, promotion.tolerance
    if promotion.higher_is_better:
        passed = new >= old - tolerance
    else:
        passed = new <= old + tolerance
    verdict = {
        "metric": promotion.metric,
        "challenger": new,
        "champion": old,
        **scores.details,
        "tolerance": tolerance,
        "passed": bool(passed),
    }
    if not passed:
        metric = promotion.metric
        direction = "below" if promotion.higher_is_better else "above"
        verdict["reason"] = (
            f"challenger {metric} {new:.4f} is {direction} champion {metric} {old:.4f}: worse "
            f"than champion v{champion} by more than the tolerance {tolerance} on {scores.rows}"
        )
    return verdict


class CompileReportMissing(NotReady):
    """The pipeline compiles, and its compile step left no report for this training run."""


def compile_gate_reasons(promotion: Promotion, report: Mapping[str, Any] | None) -> list[str]:
    """Why the compile gate blocks a promotion (empty: it does not). Only ``"passed": true``
    passes: a report that says anything else (``"false"``, nothing) is a failed gate."""
    if report is None:
        if promotion.requires_compile_gate:
            return ["compile gate: no report; the compile step must pass before a promotion"]
        return []
    if report.get("passed") is True:
        return []
    return [f"compile gate: {r}" for r in report.get("reasons") or ["failed"]]


def decide(
    client: Any,
    name: str,
    version: Any,
    *,
    promotion: Promotion,
    score: Score,
    compile_gate: Mapping[str, Any] | None,
    baseline: Baseline | None = None,
    signing_key: Ed25519PrivateKey | None = None,
) -> Decision:
    """Decide on ``version`` of ``name`` and move the aliases (see the module's docstring).

    With ``signing_key`` the version's release is signed (:mod:`cascade.signing`) with the
    decision before any alias moves to it, so a server never sees an alias on an unsigned
    version the gate passed; a decision the champion's move overtook is signed again as not
    promoted."""
    new_version = str(version.version)
    reasons = compile_gate_reasons(promotion, compile_gate)
    champion = version_by_alias(client, name, CHAMPION)
    comparison: dict[str, Any] | None = None
    compared_with = None
    if champion is None:
        previous = None
    elif str(champion.version) == new_version:
        # A retry after the alias moved but before the decision was stored.
        previous = version.tags.get(PREVIOUS_CHAMPION_TAG) or None
    else:
        previous, compared_with = str(champion.version), champion
        comparison = compare(promotion, score(champion), champion=previous)
        if not comparison["passed"]:
            reasons.append(comparison["reason"])
    floor = None if baseline is None else baseline.verdict()
    if floor is not None and not floor["passed"]:
        reasons.append(floor["reason"])
    expected = None if champion is None else str(champion.version)

    promoted, moved, holder = not reasons, False, previous

    def sign() -> None:
        if signing_key is not None:
            decided = {"promoted": promoted, "reasons": list(reasons), "by": "promotion gate"}
            sign_version(client, signing_key, name, new_version, compile_gate=compile_gate,
                         decision={**decided, "previous_champion": previous})  # fmt: skip

    sign()
    client.set_registered_model_alias(name, CHALLENGER, new_version)
    if promoted:
        with alias_lock(client):  # compare and set: no other move between the read and ours
            current = version_by_alias(client, name, CHAMPION)
            now = None if current is None else str(current.version)
            if now == expected:
                client.set_model_version_tag(
                    name, new_version, PREVIOUS_CHAMPION_TAG, previous or ""
                )
                client.set_registered_model_alias(name, CHAMPION, new_version)
                holder = new_version
        if now != expected:
            promoted, moved, holder = False, True, now
            reasons.append(
                f"the champion changed from {_named(expected)} to {_named(now)} while this "
                "decision was made; the alias stays: register again to decide against the new "
                "champion"
            )
            log.warning("%s v%s not promoted: %s", name, new_version, reasons[-1])
            sign()
    return Decision(
        version=new_version,
        promoted=promoted,
        champion_version=holder,
        previous_champion=previous,
        compared_with=compared_with,
        comparison=comparison,
        reasons=reasons,
        champion_moved=moved,
        baseline=floor,
    )


def _named(version: str | None) -> str:
    return "none" if version is None else f"v{version}"


def register_and_promote(
    client: Any,
    new: NewVersion,
    *,
    promotion: Promotion,
    score: Score,
    compile_gate: Mapping[str, Any] | None,
    report: Callable[[Decision], dict[str, Any]],
    baseline: Baseline | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Register the training run ``new`` (once), decide on it with :func:`decide` (against
    ``baseline`` too, when given) and return
    the caller's ``report`` of the decision, stored on the version so a repeated call returns
    it; with ``signing_key``, the version's release is signed with the decision
    (:func:`decide`). A decision the champion's move overtook is returned but not stored.

    With ``settings`` pointing at the local stack's tracking server, every registry write runs
    as the promoter (:func:`cascade.tracking_auth.acting_as`), whose credential no service's
    environment holds: the task's own (the writer) can neither register nor move an alias.

    Raises :class:`CompileReportMissing` (nothing registered, no alias moved) when the rule
    requires the compile gate and ``compile_gate`` is None."""
    if compile_gate is None and promotion.requires_compile_gate:
        raise CompileReportMissing(
            f"no compile gate report for {new.name} (training run {new.run_id}): this pipeline "
            "compiles, so no version is registered or promoted without the report; run the "
            "pipeline's compile step for this partition, then register again"
        )
    scope = contextlib.nullcontext() if settings is None else acting_as(settings, PROMOTER)
    with scope:
        ensure_registered_model(client, new.name, new.model_description)
        version, stored = version_of_run(client, new.name, new.run_id)
        if stored is not None:
            return stored
        if version is None:
            version = client.create_model_version(
                new.name,
                source=new.source,
                run_id=new.run_id,
                model_id=new.model_id,
                tags=dict(new.tags),
                description=new.description,
            )
        decision = decide(
            client,
            new.name,
            version,
            promotion=promotion,
            score=score,
            compile_gate=compile_gate,
            baseline=baseline,
            signing_key=signing_key,
        )
        result = report(decision)
        if not decision.champion_moved:
            stored_record = json.dumps(result)
            client.set_model_version_tag(new.name, decision.version, DECISION_TAG, stored_record)
        return result
