"""The security benchmark's well-formed infer requests: shaped by the server's OpenAPI
document, within the served id ranges and the server's limits."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from benchmarks.security_fuzz import (
    ServedLimits,
    infer_2xx,
    infer_tensor_fields,
    served_limits,
    valid_infer_bodies,
)


@pytest.fixture(scope="module")
def v2_document() -> dict[str, Any]:
    """The OpenAPI document of KServe's v2 routes, as the model server publishes them."""
    from fastapi import FastAPI
    from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

    app = FastAPI()
    register_v2_endpoints(app, None, None)
    return app.openapi()


def test_tensor_fields_come_from_the_infer_operation(v2_document: dict[str, Any]) -> None:
    assert {"name", "datatype", "shape", "data"} <= set(infer_tensor_fields(v2_document))


def test_a_document_without_an_infer_body_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="no POST .../infer operation"):
        infer_tensor_fields({"paths": {"/v2/health/live": {"get": {}}}})


LIMITS = ServedLimits(users=(1, 943), items=(1, 1682), max_candidates=40, max_body_bytes=400)
FIELDS = ["name", "shape", "datatype", "parameters", "data"]


@given(body=valid_infer_bodies(LIMITS, FIELDS))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_valid_bodies_obey_the_served_ranges_and_limits(body: bytes) -> None:
    assert len(body) <= LIMITS.max_body_bytes
    tensors = {t["name"]: t for t in json.loads(body)["inputs"]}
    assert set(tensors) == {"user_id", "item_ids"}
    (user,) = tensors["user_id"]["data"]
    items = tensors["item_ids"]["data"]
    assert LIMITS.users[0] <= user <= LIMITS.users[1]
    assert 1 <= len(items) <= LIMITS.max_candidates
    assert all(LIMITS.items[0] <= item <= LIMITS.items[1] for item in items)
    for tensor in tensors.values():
        assert tensor["datatype"] == "INT64" and tensor["shape"] == [len(tensor["data"])]


SMALL = ServedLimits(users=(5, 5), items=(100, 100), max_candidates=500, max_body_bytes=300)


@given(body=valid_infer_bodies(SMALL, FIELDS, most_items=500))
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_body_limit_cuts_long_candidate_lists(body: bytes) -> None:
    assert len(body) <= SMALL.max_body_bytes
    assert json.loads(body)["inputs"][1]["data"][0] == 100


def test_limits_read_from_the_training_frame() -> None:
    frame = pd.DataFrame({"user_id": [3, 9, 4], "item_id": [20, 2, 7]})
    limits = served_limits(frame, max_candidates=10, max_body_bytes=1000)
    assert (limits.users, limits.items) == ((3, 9), (2, 20))
    with pytest.raises(ValueError, match="served users range 9..3 is empty"):
        ServedLimits(users=(9, 3), items=(1, 2), max_candidates=1, max_body_bytes=1)


def test_infer_2xx_counts_only_scored_infer_requests() -> None:
    statuses = {
        "POST /v2/models/{model_name}/infer": {200: 7, 400: 3, 422: 9},
        "GET /v2/models/{model_name}": {200: 50},
        "POST /v2/models/{model_name}/ready/infer": {204: 1, 503: 2},
    }
    assert infer_2xx(statuses) == 8
