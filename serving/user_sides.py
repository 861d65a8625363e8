"""Each user's share of the pre-ranker's inputs, held between that user's requests.

A served version whose every field beyond the ids is the user's own (a view keyed by the user)
or a cross of the user and the candidate's genre (a view keyed by user and ``item_category``)
scores a request from two things: the item table's rows of the candidates, fixed for the
version, and the user's fields, encoded. The second is the same for every request of the user
until the online store answers differently, so it is built once
(:meth:`serving.cold_scorer.CompiledColdScorer.user_side`: the user's codes and the cross codes
of each genre) and held (:class:`UserSides`) under the store's stamp
(:meth:`domains.ctr.online_cross.OnlineCrossReader.stamp`: its data version and the newest
partition of each view) until the views' ttl first turns one of its values missing. A request
of a held user then reads nothing and encodes nothing but the candidates' table rows.

Requests that carry fields of their own, versions with another kind of field, and stores that
are not packed (no data version to compare) take the full path of
:meth:`serving.preranking.PreRankingModel.score_request`; both give the same codes.
"""

from __future__ import annotations

from typing import Any

from serving.cold_scorer import UserSide
from serving.online_fields import GENRE_KEY, USER_KEY, OnlineFieldPlan

MAX_USERS = 16_384
"""Users held at most (about a kilobyte each for a few dozen fields); past it all are dropped."""


def user_side_views(plan: OnlineFieldPlan, *, keyed_cross: bool, required: Any) -> tuple[str, ...]:
    """The views whose answers a version's :class:`UserSide` derives from, or ``()`` when the
    version's requests cannot be scored from one: a field the request must carry
    (``required``), a package without the per-key cross input (``keyed_cross`` False), no view
    read per request, or a view keyed by anything but the user and the genre, or holding an
    item field."""
    if required or not keyed_cross or not plan.reads:
        return ()
    for read in plan.reads:
        keys = set(read.join_keys)
        if USER_KEY not in keys or not keys <= {USER_KEY, GENRE_KEY}:
            return ()
        if not set(read.kinds) <= {"user", "cross"}:
            return ()
    return tuple(read.view for read in plan.reads)


class UserSides:
    """:class:`UserSide` by user id, each under the stamp it was built at and the moment it
    expires (µs since the epoch, None: never by age)."""

    def __init__(self, views: tuple[str, ...], *, max_users: int = MAX_USERS) -> None:
        if max_users < 1:
            raise ValueError(f"max_users must be >= 1, got {max_users}")
        self.views = views
        self.max_users = max_users
        self._held: dict[int, tuple[Any, int | None, UserSide]] = {}
        self.hits = 0
        self.builds = 0

    def get(self, user_id: int, stamp: Any, now_us: int) -> UserSide | None:
        """The side held for ``user_id`` if it was built at ``stamp`` and has not expired at
        ``now_us``, else None."""
        held = self._held.get(user_id)
        if held is None or held[0] != stamp or (held[1] is not None and now_us >= held[1]):
            return None
        self.hits += 1
        return held[2]

    def put(self, user_id: int, stamp: Any, expires_us: int | None, side: UserSide) -> None:
        self.builds += 1
        if len(self._held) >= self.max_users and user_id not in self._held:
            self._held.clear()
        self._held[user_id] = (stamp, expires_us, side)

    def __len__(self) -> int:
        return len(self._held)
