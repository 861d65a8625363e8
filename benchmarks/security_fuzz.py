"""Well-formed infer requests for the security benchmark's fuzzer: besides what schemathesis
generates from the OpenAPI document (mostly refused before scoring), a share of requests valid
in every respect the server checks, so the fuzzer reaches scoring too.

The shape comes from the server's own OpenAPI document (the infer operation's request body and
its tensor fields), the limits from the server's settings (``max_candidates``, the body limit)
and the ids from the ranges the served model was trained on (:class:`ServedLimits`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

INFER_SUFFIX = "/infer"


@dataclass(frozen=True)
class ServedLimits:
    """What a valid request to the pre-ranker obeys: ids in the served ranges, at most
    ``max_candidates`` items and a body of at most ``max_body_bytes``."""

    users: tuple[int, int]
    items: tuple[int, int]
    max_candidates: int
    max_body_bytes: int

    def __post_init__(self) -> None:
        for name, (low, high) in (("users", self.users), ("items", self.items)):
            if low > high:
                raise ValueError(f"served {name} range {low}..{high} is empty; pass low <= high")
        if self.max_candidates < 1 or self.max_body_bytes < 1:
            raise ValueError(
                f"max_candidates ({self.max_candidates}) and max_body_bytes"
                f" ({self.max_body_bytes}) must be >= 1"
            )


def served_limits(frame: Any, *, max_candidates: int, max_body_bytes: int) -> ServedLimits:
    """The limits of a model trained on ``frame`` (columns ``user_id`` and ``item_id``)."""
    return ServedLimits(
        users=(int(frame["user_id"].min()), int(frame["user_id"].max())),
        items=(int(frame["item_id"].min()), int(frame["item_id"].max())),
        max_candidates=max_candidates,
        max_body_bytes=max_body_bytes,
    )


def infer_tensor_fields(schema: dict[str, Any]) -> list[str]:
    """The fields of one input tensor of the infer request, read from the OpenAPI document
    (the ``inputs`` items of the first ``/infer`` operation's JSON body). An error names the
    document part that is missing."""
    components = schema.get("components", {}).get("schemas", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while True:
            if "$ref" in node:
                node = components[node["$ref"].rsplit("/", 1)[-1]]
                continue
            # A body that is JSON or raw bytes: the JSON object's branch.
            objects = [
                branch
                for branch in node.get("anyOf", node.get("oneOf", []))
                if "$ref" in branch or "properties" in branch
            ]
            if not objects:
                return node
            node = objects[0]

    for path, item in schema.get("paths", {}).items():
        body = item.get("post", {}).get("requestBody", {})
        content = body.get("content", {}).get("application/json", {})
        if not path.endswith(INFER_SUFFIX) or "schema" not in content:
            continue
        request = resolve(content["schema"])
        inputs = resolve(request.get("properties", {}).get("inputs", {}))
        tensor = resolve(inputs.get("items", {}))
        fields = list(tensor.get("properties", {}))
        if fields:
            return fields
    raise ValueError(
        "the OpenAPI document has no POST .../infer operation with a JSON body whose 'inputs'"
        " items have properties; serve a model with a v2 infer route"
    )


def _tensor(fields: list[str], name: str, data: list[int]) -> dict[str, Any]:
    values = {"name": name, "datatype": "INT64", "shape": [len(data)], "data": data}
    missing = {"name", "datatype", "shape", "data"} - set(fields)
    if missing:
        raise ValueError(
            f"the infer request's tensor has no {sorted(missing)} in the OpenAPI document;"
            " the server does not speak the v2 protocol"
        )
    return {field: values[field] for field in fields if field in values}


def valid_infer_bodies(limits: ServedLimits, fields: list[str], *, most_items: int = 64) -> Any:
    """A hypothesis strategy of JSON bodies (bytes) the pre-ranker must score: a user and up to
    ``min(most_items, max_candidates)`` items, each id in its served range, the body within
    the byte limit (larger candidate lists are cut until it is)."""
    from hypothesis import strategies as st

    top = max(1, min(most_items, limits.max_candidates))
    users = st.integers(*limits.users)
    items = st.lists(st.integers(*limits.items), min_size=1, max_size=top)

    def body(user: int, item_ids: list[int]) -> bytes:
        while True:
            encoded = json.dumps(
                {
                    "inputs": [
                        _tensor(fields, "user_id", [user]),
                        _tensor(fields, "item_ids", item_ids),
                    ]
                }
            ).encode()
            if len(encoded) <= limits.max_body_bytes or len(item_ids) == 1:
                return encoded
            item_ids = item_ids[: len(item_ids) // 2]

    return st.builds(body, users, items)


def infer_2xx(statuses: dict[str, Any]) -> int:
    """Answers 2xx to the infer operations in a per-operation status histogram (``"POST
    /path"`` -> status -> count): requests that reached scoring."""
    return sum(
        count
        for operation, histogram in statuses.items()
        if operation.endswith(INFER_SUFFIX)
        for status, count in histogram.items()
        if 200 <= int(status) < 300
    )
