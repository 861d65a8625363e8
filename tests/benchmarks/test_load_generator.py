"""The load generator's requests and answer checks."""

from __future__ import annotations

import orjson
import pytest

from benchmarks.load_generator import check_response, request_bodies


def test_request_bodies_are_id_only_v2_requests_with_distinct_candidates() -> None:
    bodies = request_bodies([1, 2, 3], list(range(100)), candidates=40, count=5, seed=1)
    assert len(bodies) == 5
    first = orjson.loads(bodies[0])
    user, items = first["inputs"]
    assert (user["name"], user["datatype"], user["shape"]) == ("user_id", "INT64", [1])
    assert user["data"][0] in (1, 2, 3)
    assert (items["name"], items["shape"]) == ("item_ids", [40])
    assert len(set(items["data"])) == 40 and set(items["data"]) <= set(range(100))
    assert len({b for b in bodies}) == 5  # a pool of different requests
    assert bodies == request_bodies([1, 2, 3], list(range(100)), candidates=40, count=5, seed=1)
    with pytest.raises(ValueError, match="only 10 item ids"):
        request_bodies([1], list(range(10)), candidates=11, count=1, seed=0)


def test_check_response_accepts_only_one_finite_score_per_candidate() -> None:
    good = orjson.dumps({"outputs": [{"name": "scores", "data": [0.1, 0.9]}]})
    assert check_response(200, good, 2) is None
    assert "HTTP 400" in (check_response(400, b'{"error": "x"}', 2) or "")
    assert "expected 3" in (check_response(200, good, 3) or "")
    assert "unreadable" in (check_response(200, b"{}", 2) or "")
    nan = b'{"outputs": [{"data": [0.1, NaN]}]}'
    assert check_response(200, nan, 2) is not None
