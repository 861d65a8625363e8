"""A client of a running Open Inference Protocol v2 model server, and the deploy steps' wait.

Every served model's client (:mod:`serving.preranking_client`, :mod:`serving.asr_client`) is a
:class:`V2Client` with the model's own request: :meth:`V2Client.infer` posts a v2 JSON body,
:meth:`V2Client.served_version` probes which registry version answers requests now (KServe's
model metadata has no version it fills, so an inference is the reliable way: every Cascade
server names its ``model_version`` in the response's parameters), and
:func:`wait_until_served` is what a pipeline's deploy step waits with.

Nothing heavy is imported here (no torch, no kserve): Airflow tasks import this module. The
server side of the protocol is :mod:`serving.v2_codec`.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

log = logging.getLogger(__name__)


class InferenceRefused(RuntimeError):
    """The server answered an inference with an error status, or without the expected output."""


def bytes_input(name: str, content: bytes) -> dict[str, Any]:
    """A v2 JSON input holding one BYTES element: ``content`` base64-encoded."""
    return {
        "name": name,
        "datatype": "BYTES",
        "shape": [1],
        "data": [base64.b64encode(content).decode()],
    }


INFERENCE_HEADER = "Inference-Header-Content-Length"
"""The binary tensor extension's header: the length of the JSON that starts the body."""
BINARY_FORMATS = {
    "BOOL": "?",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "FP32": "f",
    "FP64": "d",
}
"""``struct`` formats of the v2 datatypes sent as raw little-endian bytes."""


def encode_binary_request(
    body: Mapping[str, Any], *, binary_output: bool = True
) -> tuple[bytes, int]:
    """``(body bytes, JSON header length)`` of the v2 request ``body`` (inputs with ``data``
    lists) in the binary tensor extension: each input of a datatype in
    :data:`BINARY_FORMATS` becomes raw little-endian bytes after the JSON header, declared by
    its ``binary_data_size``; others stay JSON. ``binary_output``: ask for the outputs as
    raw bytes too (``binary_data_output``)."""
    inputs, raw = [], []
    for tensor in body.get("inputs") or []:
        code = BINARY_FORMATS.get(tensor.get("datatype"))
        if code is None:
            inputs.append(dict(tensor))
            continue
        values = list(tensor["data"])
        raw.append(struct.pack(f"<{len(values)}{code}", *values))
        parameters = {**(tensor.get("parameters") or {}), "binary_data_size": len(raw[-1])}
        described = {k: v for k, v in tensor.items() if k != "data"}
        inputs.append({**described, "parameters": parameters})
    header = {**body, "inputs": inputs}
    if binary_output:
        header["parameters"] = {**(body.get("parameters") or {}), "binary_data_output": True}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + b"".join(raw), len(encoded)


def decode_binary_response(content: bytes, json_length: int) -> dict[str, Any]:
    """A v2 response in the binary tensor extension as its JSON form: each output that
    declares ``binary_data_size`` gets its ``data`` list from the bytes after the header;
    ValueError when the sizes and the body do not add up."""
    if not 0 < json_length <= len(content):
        raise ValueError(f"{INFERENCE_HEADER}={json_length}; the answer has {len(content)} bytes")
    payload = dict(json.loads(content[:json_length]))
    offset = json_length
    for output in outputs(payload):
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            continue
        code = BINARY_FORMATS.get(output.get("datatype"))
        width = struct.calcsize(f"<{code}") if code else 0
        if not width or size % width or offset + size > len(content):
            raise ValueError(
                f"output {output.get('name')!r}: binary_data_size={size} does not fit its "
                f"datatype {output.get('datatype')!r} or the {len(content) - offset} bytes left"
            )
        output["data"] = list(struct.unpack_from(f"<{size // width}{code}", content, offset))
        offset += size
    if offset != len(content):
        raise ValueError(f"{len(content) - offset} bytes follow the declared binary outputs")
    return payload


def response_version(payload: Mapping[str, Any]) -> str | None:
    """The registry version a v2 response was computed with (its parameters' ``model_version``,
    else the response's own), None when it names none."""
    version = (payload.get("parameters") or {}).get("model_version") or payload.get("model_version")
    return None if version is None else str(version)


def outputs(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A v2 response's outputs (``{"name", "shape", "datatype", "data"}`` objects)."""
    return list(payload.get("outputs") or [])


@dataclass(frozen=True)
class V2Client:
    """One model on a v2 server at ``base_url`` (``http://host:port``)."""

    base_url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every request (the serving token's ``Authorization``)."""

    @property
    def url(self) -> str:
        return f"{self.base_url}/v2/models/{self.model}"

    @property
    def infer_url(self) -> str:
        return f"{self.url}/infer"

    def ready(self, *, timeout_s: float) -> bool:
        """Whether the model answers ``ready``; raises ``requests.RequestException`` when
        nothing listens."""
        response = requests.get(f"{self.url}/ready", headers=dict(self.headers), timeout=timeout_s)
        return response.status_code == 200

    def infer(
        self,
        body: Mapping[str, Any],
        *,
        timeout_s: float,
        output: str | None = None,
        binary: bool = False,
    ) -> dict[str, Any]:
        """The JSON answer to the v2 request ``body``; :class:`InferenceRefused` with the
        server's message when it answers with an error status (or without the ``output`` it
        must hold), ``requests.ConnectionError`` when nothing listens. ``binary``: send the
        numeric inputs and take the outputs as raw bytes (the binary tensor extension,
        :func:`encode_binary_request`); the answer is returned in its JSON form all the same."""
        headers = dict(self.headers)
        if binary:
            data, json_length = encode_binary_request(body)
            headers["Content-Type"] = "application/octet-stream"
            headers[INFERENCE_HEADER] = str(json_length)
            response = requests.post(self.infer_url, data=data, headers=headers, timeout=timeout_s)
        else:
            response = requests.post(
                self.infer_url, json=dict(body), headers=headers, timeout=timeout_s
            )
        if response.status_code != 200:
            raise InferenceRefused(
                f"{self.infer_url} answered {response.status_code}: {response.text[:500]}"
            )
        answer_length = response.headers.get(INFERENCE_HEADER)
        if answer_length is not None:
            try:
                payload = decode_binary_response(response.content, int(answer_length))
            except ValueError as exc:
                unreadable = f"{self.infer_url} answered unreadable bytes: {exc}"
                raise InferenceRefused(unreadable) from exc
        else:
            payload = dict(response.json())
        if output is not None and output not in {o.get("name") for o in outputs(payload)}:
            raise InferenceRefused(f"{self.infer_url} returned no {output!r} output: {payload}")
        return payload

    def served_version(
        self,
        body: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        *,
        timeout_s: float,
        output: str | None = None,
    ) -> str | None:
        """The version that answers the probe request ``body`` (or the one it makes) now, None
        while the server is down, not ready or refusing the probe."""
        try:
            if not self.ready(timeout_s=timeout_s):
                return None
            request = body() if callable(body) else body
            payload = self.infer(request, timeout_s=timeout_s, output=output)
        except (requests.RequestException, RuntimeError, ValueError) as exc:
            log.debug("probe of %s failed: %s", self.url, exc)
            return None
        return response_version(payload)


def wait_until_served(
    champion: str,
    served_version: Callable[[], str | None],
    *,
    url: str,
    ds: str,
    timeout_s: float,
    poll_s: float,
    hint: str,
) -> dict[str, Any]:
    """Poll ``served_version()`` of the server at ``url`` until it is ``champion`` (the
    version registered for partition ``ds``); returns ``{"served_version",
    "champion_version", "url", "waited_s"}``. TimeoutError naming the server and the ``hint``
    when it is not within ``timeout_s``."""
    what = f"ds={ds}: {url}"
    started = time.monotonic()
    while True:
        served = served_version()
        waited = time.monotonic() - started
        if served == champion:
            log.info("%s serves champion version %s after %.1fs", what, served, waited)
            return {
                "served_version": served,
                "champion_version": champion,
                "url": url,
                "waited_s": round(waited, 3),
            }
        if waited >= timeout_s:
            raise TimeoutError(
                f"{what} still serves version {served!r} (None = down or not ready) after "
                f"{timeout_s:.0f}s, but the registry's champion is {champion!r}; {hint}"
            )
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
