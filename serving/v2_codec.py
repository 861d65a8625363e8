"""The Open Inference Protocol v2 codec: request and response bodies, JSON and binary.

Shared by every model server (pre-ranking, ASR). :func:`decode_v2_tensors` and
:func:`decode_v2_json` read a JSON body, checking the protocol's structure only (a body that is
not a v2 request raises :class:`MalformedRequest`, HTTP 422); :func:`decode_binary_request`
reads the binary tensor extension (a JSON header of ``Inference-Header-Content-Length`` bytes,
then the tensors' bytes); :func:`encode_v2_json` and :func:`v2_response_body` write the JSON
answer. What a tensor must hold is the model's to check. A request ``id`` is 1 to 128 letters,
digits, ``.``, ``_``, ``:`` or ``-`` (:func:`check_request_id`, HTTP 400 otherwise): it is echoed
in the answer and written to the feedback lake.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput, to_http_parameters

INFERENCE_HEADER = "inference-header-content-length"
"""Request header of the binary tensor extension: the length of the JSON header."""


class MalformedRequest(InvalidInput):
    """A body that is not a v2 JSON request at all (HTTP 422, as KServe answers it)."""


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""What a request id may be: it is echoed in the answer and stored with the feedback rows."""


def check_request_id(request_id: Any) -> str | None:
    """``request_id`` if it is absent or a bounded id; MalformedRequest (422) for a non-string,
    InvalidInput (400) for a string of the wrong length or characters (not echoed back)."""
    if request_id is None:
        return None
    if not isinstance(request_id, str):
        raise MalformedRequest(f"field 'id' must be a string, got {type(request_id).__name__}")
    if REQUEST_ID.fullmatch(request_id) is None:
        raise InvalidInput(
            f"field 'id' must be 1 to 128 letters, digits, '.', '_', ':' or '-' "
            f"(got {len(request_id)} characters)"
        )
    return request_id


def not_json(what: str, exc: ValueError) -> MalformedRequest:
    """MalformedRequest naming where the JSON broke, not the parser's message."""
    line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    where = f" (line {line}, column {column})" if line is not None else ""
    return MalformedRequest(f"{what} is not JSON{where}")


@dataclass(frozen=True, slots=True)
class JsonTensor:
    """One input tensor of a v2 JSON body, checked for structure only (the fields a model
    reads of an ``InferInput``, whose data is always a list here)."""

    name: str
    datatype: str
    shape: list[int]
    data: list[Any]
    parameters: Any = None


def decode_v2_tensors(body: bytes) -> tuple[str | None, list[JsonTensor], Any]:
    """``(request id, input tensors, request parameters)`` of a v2 JSON body, checking only
    the protocol's structure; MalformedRequest (HTTP 422) naming what is wrong."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise not_json("the request body", exc) from None
    if not isinstance(payload, dict):
        raise MalformedRequest(
            f"the request body is a JSON {type(payload).__name__}; send an object with 'inputs'"
        )
    inputs = payload.get("inputs")
    if not isinstance(inputs, list):
        raise MalformedRequest(
            "field 'inputs' must be a list of tensors "
            f"({{'name', 'datatype', 'shape', 'data'}}), got {type(inputs).__name__}"
        )
    request_id = check_request_id(payload.get("id"))
    tensors = []
    for position, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise MalformedRequest(f"inputs[{position}] must be an object, got {tensor!r:.80}")
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        data = tensor.get("data")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise MalformedRequest(f"inputs[{position}] needs string fields 'name' and 'datatype'")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise MalformedRequest(f"input '{name}' needs 'shape', a list of integers")
        if not isinstance(data, list):
            raise MalformedRequest(f"input '{name}' needs 'data', a list of values")
        tensors.append(JsonTensor(name, datatype, shape, data, tensor.get("parameters")))
    return request_id, tensors, payload.get("parameters")


def decode_v2_json(body: bytes, model_name: str) -> InferRequest:
    """An ``InferRequest`` from a v2 JSON body, checking only the protocol's structure.

    KServe's own route validates the body into pydantic models field by field and builds the
    answer through FastAPI's ``jsonable_encoder``, which walks every float of the 1,000-score
    output one by one: ~4 ms of the ~6 ms a request cost. This does the same job with orjson;
    the tensors' values are checked by the model, as on KServe's route.
    """
    request_id, tensors, parameters = decode_v2_tensors(body)
    return InferRequest(
        model_name=model_name,
        infer_inputs=[
            InferInput(
                name=t.name,
                shape=t.shape,
                datatype=t.datatype,
                data=t.data,
                parameters=t.parameters,
            )
            for t in tensors
        ],
        request_id=request_id,
        parameters=parameters,
    )


def require_v2(payload: Any, model_name: str) -> InferRequest:
    """``payload`` if it is a v2 request, else InvalidInput (a v1 ``{"instances": ...}`` body
    reached ``predict`` through KServe's generic v1 route); its id checked by
    :func:`check_request_id`."""
    if not isinstance(payload, InferRequest):
        raise InvalidInput(
            f"send an Open Inference Protocol v2 request to /v2/models/{model_name}/infer"
        )
    check_request_id(payload.id)
    return payload


def encode_v2_json(response: InferResponse) -> bytes:
    """The v2 JSON body of ``response``, as ``InferResponse.to_rest`` shapes it."""
    outputs = []
    for output in response.outputs:
        data = output.data
        if not isinstance(data, np.ndarray | list):
            data = output.as_numpy()
        entry: dict[str, Any] = {
            "name": output.name,
            "shape": list(output.shape),
            "datatype": output.datatype,
            "data": data,
        }
        if output.parameters:
            entry["parameters"] = to_http_parameters(output.parameters)
        outputs.append(entry)
    return v2_response_body(
        response_id=response.id,
        model_name=response.model_name,
        model_version=response.model_version,
        outputs=outputs,
        parameters=to_http_parameters(response.parameters) if response.parameters else None,
    )


def v2_response_body(
    *,
    response_id: str | None,
    model_name: str,
    model_version: str | None,
    outputs: list[dict[str, Any]],
    parameters: Mapping[str, Any] | None = None,
) -> bytes:
    """A v2 JSON response body: ``outputs`` are ``{"name", "shape", "datatype", "data"}``
    objects (numpy arrays serialized as lists), ``parameters`` left out when empty."""
    body: dict[str, Any] = {
        "id": response_id,
        "model_name": model_name,
        "model_version": model_version,
        "outputs": outputs,
    }
    if parameters:
        body["parameters"] = parameters
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_binary_request(body: bytes, json_length: str, model_name: str) -> InferRequest:
    """A v2 request in the binary tensor extension (JSON header, then the tensors' bytes)."""
    try:
        header_size = int(json_length)
    except ValueError:
        raise MalformedRequest(f"{INFERENCE_HEADER}={json_length!r} is not an integer") from None
    if not 0 < header_size <= len(body):
        raise MalformedRequest(
            f"{INFERENCE_HEADER}={header_size} but the body has {len(body)} bytes"
        )
    try:
        payload = orjson.loads(body[:header_size])
    except orjson.JSONDecodeError as exc:
        raise not_json("the JSON header", exc) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list):
        raise MalformedRequest("the JSON header needs 'inputs', a list of tensors")
    offset, inputs = header_size, []
    for position, tensor in enumerate(payload["inputs"]):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise MalformedRequest(f"inputs[{position}] must be an object with a 'name'")
        parameters = tensor.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        data = tensor.get("data")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(body):
                raise InvalidInput(
                    f"input '{tensor['name']}' declares binary_data_size={size!r} but "
                    f"{len(body) - offset} bytes follow"
                )
            data, offset = [body[offset : offset + size]], offset + size
        elif not isinstance(data, list):
            raise MalformedRequest(f"input '{tensor['name']}' needs 'data' or binary_data_size")
        inputs.append(
            InferInput(
                name=tensor["name"],
                shape=tensor.get("shape") or [],
                datatype=str(tensor.get("datatype")),
                data=data,
            )
        )
    if offset != len(body):
        raise InvalidInput(f"{len(body) - offset} bytes follow the declared binary inputs")
    return InferRequest(
        model_name=model_name,
        infer_inputs=inputs,
        request_id=check_request_id(payload.get("id")),
        parameters=payload.get("parameters"),
    )
