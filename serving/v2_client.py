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
import logging
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
        self, body: Mapping[str, Any], *, timeout_s: float, output: str | None = None
    ) -> dict[str, Any]:
        """The JSON answer to the v2 request ``body``; :class:`InferenceRefused` with the
        server's message when it answers with an error status (or without the ``output`` it
        must hold), ``requests.ConnectionError`` when nothing listens."""
        response = requests.post(
            self.infer_url, json=dict(body), headers=dict(self.headers), timeout=timeout_s
        )
        if response.status_code != 200:
            raise InferenceRefused(
                f"{self.infer_url} answered {response.status_code}: {response.text[:500]}"
            )
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
