"""The pre-ranking model's request inputs: ``user_id`` (INT64 ``[1]``), ``item_ids`` (INT64
``[N]``) and the fields a served version reads from its inputs, each checked and decoded from
an Open Inference Protocol v2 tensor (JSON or binary), or InvalidInput (HTTP 400) naming the
input and what to send. The model that scores them is :mod:`serving.preranking`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np
from kserve import InferRequest
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput

from serving.v2_codec import JsonTensor

USER_INPUT = "user_id"
ITEMS_INPUT = "item_ids"
ID_DATATYPE = "INT64"


def _ids_from_input(
    infer_input: InferInput | JsonTensor, *, expected_len: int | None
) -> np.ndarray:
    """The int64 ids of one input tensor, or InvalidInput naming what is wrong with it."""
    name = infer_input.name
    if infer_input.datatype != ID_DATATYPE:
        raise InvalidInput(
            f"input '{name}' has datatype {infer_input.datatype}; send ids as {ID_DATATYPE}"
        )
    shape = list(infer_input.shape or [])
    if len(shape) != 1 or shape[0] < 0:
        raise InvalidInput(f"input '{name}' has shape {shape}; it must be one-dimensional, [N]")
    if expected_len is not None and shape[0] != expected_len:
        raise InvalidInput(f"input '{name}' has shape {shape}; it must be [{expected_len}]")
    data = infer_input.data
    if isinstance(data, list):
        # JSON numbers: np.array(..., dtype=int64) would silently truncate 1.5 and accept True.
        if not set(map(type, data)) <= {int}:  # C-speed over 1,000 ids; bool is not int
            bad = next(v for v in data if type(v) is not int)
            raise InvalidInput(f"input '{name}' holds {bad!r}; ids must be integers")
        try:
            ids = np.asarray(data, dtype=np.int64)
        except OverflowError:
            raise InvalidInput(f"input '{name}' holds an id outside the INT64 range") from None
    elif isinstance(data, np.ndarray):  # raw bytes, typed by the codec as the datatype says
        ids = data.reshape(-1)
    else:
        # Binary tensor extension: the bytes are decoded with the declared datatype.
        try:
            ids = np.asarray(infer_input.as_numpy(), dtype=np.int64).reshape(-1)  # type: ignore[union-attr]
        except (ValueError, TypeError, InvalidInput) as exc:
            raise InvalidInput(f"input '{name}' could not be decoded as {shape}: {exc}") from exc
    if ids.shape[0] != shape[0]:
        raise InvalidInput(
            f"input '{name}' declares shape {shape} but carries {ids.shape[0]} values"
        )
    return ids


def parse_request(request: InferRequest, *, max_candidates: int) -> tuple[int, np.ndarray]:
    """``(user_id, item_ids)`` of a v2 request; InvalidInput (HTTP 400) naming the problem."""
    return parse_inputs(request.inputs or [], max_candidates=max_candidates)


def parse_inputs(
    tensors: Sequence[InferInput | JsonTensor], *, max_candidates: int
) -> tuple[int, np.ndarray]:
    """:func:`parse_request` on the input tensors themselves."""
    user, items, _ = parse_field_inputs(tensors, max_candidates=max_candidates, fields={})
    return user, items


FIELD_DATATYPES = frozenset({"FP32", "FP64", "INT64", "INT32"})
"""Datatypes a field input (see :func:`parse_field_inputs`) may carry."""


def _field_values(infer_input: InferInput | JsonTensor, expected_len: int) -> np.ndarray:
    """float64 values of one field input (null: NaN), or InvalidInput naming the problem."""
    name = infer_input.name
    if infer_input.datatype not in FIELD_DATATYPES:
        raise InvalidInput(
            f"input '{name}' has datatype {infer_input.datatype}; send a field's values as one "
            f"of {sorted(FIELD_DATATYPES)}"
        )
    shape = list(infer_input.shape or [])
    if shape != [expected_len]:
        raise InvalidInput(f"input '{name}' has shape {shape}; it must be [{expected_len}]")
    data = infer_input.data
    if isinstance(data, list):
        if not set(map(type, data)) <= {int, float, type(None)}:
            bad = next(v for v in data if type(v) not in (int, float, type(None)))
            raise InvalidInput(f"input '{name}' holds {bad!r}; field values must be numbers")
        values = np.array([math.nan if v is None else v for v in data], dtype=np.float64)
    elif isinstance(data, np.ndarray):  # raw bytes, typed by the codec as the datatype says
        values = data.astype(np.float64).reshape(-1)
    else:
        try:
            values = np.asarray(infer_input.as_numpy(), dtype=np.float64).reshape(-1)  # type: ignore[union-attr]
        except (ValueError, TypeError, InvalidInput) as exc:
            raise InvalidInput(f"input '{name}' could not be decoded as {shape}: {exc}") from exc
    if values.shape[0] != expected_len:
        raise InvalidInput(
            f"input '{name}' declares shape {shape} but carries {values.shape[0]} values"
        )
    return values


def parse_field_inputs(
    tensors: Sequence[InferInput | JsonTensor],
    *,
    max_candidates: int,
    fields: Mapping[str, str],
    optional: Collection[str] = (),
) -> tuple[int, np.ndarray, dict[str, np.ndarray]]:
    """``(user_id, item_ids, {field: values})`` of a request to a version that reads the
    ``fields`` (``{name: kind}``, :attr:`serving.served_version.ServedVersion.request_fields`)
    from its inputs; InvalidInput (HTTP 400) naming a missing, unknown or malformed input. The
    ``optional`` fields (those the server reads from the online store) may be left out; given,
    they win."""
    inputs: dict[str, InferInput | JsonTensor] = {}
    for infer_input in tensors:
        if infer_input.name in inputs:
            raise InvalidInput(f"input '{infer_input.name}' is given twice; send it once")
        inputs[infer_input.name] = infer_input
    unknown = sorted(set(inputs) - {USER_INPUT, ITEMS_INPUT, *fields})
    if unknown:
        takes = ", ".join(f"'{n}'" for n in (USER_INPUT, ITEMS_INPUT, *fields))
        raise InvalidInput(f"unknown inputs {unknown}; the model takes {takes}")
    absent = [name for name in fields if name not in inputs and name not in optional]
    if absent:
        raise InvalidInput(
            f"missing inputs {absent}: the served model version reads these fields; send each "
            f"as FP32 [1] for a user field or [N] (one value per item id) otherwise"
        )
    for required in (USER_INPUT, ITEMS_INPUT):
        if required not in inputs:
            raise InvalidInput(
                f"missing input '{required}'; send '{USER_INPUT}' INT64 [1] and "
                f"'{ITEMS_INPUT}' INT64 [N]"
            )
    user = _ids_from_input(inputs[USER_INPUT], expected_len=1)
    items_input = inputs[ITEMS_INPUT]
    declared = list(items_input.shape or [])
    if len(declared) == 1 and declared[0] == 0:
        raise InvalidInput(f"input '{ITEMS_INPUT}' is empty; send at least one candidate")
    if len(declared) == 1 and declared[0] > max_candidates:
        raise InvalidInput(
            f"input '{ITEMS_INPUT}' has {declared[0]} candidates; at most {max_candidates} "
            "per request (split the list or raise CASCADE_SERVING_MAX_CANDIDATES)"
        )
    items = _ids_from_input(items_input, expected_len=None)
    values = {
        name: _field_values(inputs[name], 1 if kind == "user" else len(items))
        for name, kind in fields.items()
        if name in inputs
    }
    return int(user[0]), items, values
