"""The ASR server's client: a transcript, the version that answers, and the roll-out check.

The server (:mod:`serving.asr`) swaps versions by itself (it follows ``asr@champion``);
:func:`roll_out` is the ``asr`` deploy step, which waits until it transcribes with the
registry's champion, probing with a half-second tone (:func:`served_version`). From the shell:
``cascade score --model asr --audio FILE.wav``.

Nothing heavy is imported here (no torch, no kserve): Airflow tasks import this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import requests

from cascade.config import Settings
from models.asr import REGISTERED_MODEL
from serving.v2_client import V2Client, bytes_input, wait_until_served

MODEL_NAME = REGISTERED_MODEL
"""The served model's name, the registered one's."""
AUDIO_INPUT = "audio"
"""The request's one input: a WAV file (:mod:`serving.asr` reads it)."""
PROBE_RATE = 16_000


def client(settings: Settings) -> V2Client:
    """The ASR model on the settings' ASR server."""
    return V2Client(settings.asr_serving_url, MODEL_NAME, settings.serving.auth_headers())


def request_body(wav: bytes) -> dict[str, Any]:
    """The v2 JSON request transcribing the WAV file ``wav``."""
    return {"inputs": [bytes_input(AUDIO_INPUT, wav)]}


@functools.cache
def probe_tone(seconds: float = 0.5, hz: float = 440.0) -> bytes:
    """A quiet sine tone as a 16-bit mono WAV file: audio every model version takes (made once;
    a roll-out probes with it every poll)."""
    import numpy as np

    from domains.speech.audio_features import encode_wav

    frames = np.arange(int(seconds * PROBE_RATE))
    return encode_wav(0.1 * np.sin(frames * 2 * np.pi * hz / PROBE_RATE), PROBE_RATE)


def transcribe(settings: Settings, wav: bytes, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """The server's v2 response to one WAV file; RuntimeError when it does not answer."""
    asr = client(settings)
    try:
        if asr.ready(timeout_s=timeout_s):
            return asr.infer(request_body(wav), timeout_s=timeout_s)
    except (requests.RequestException, RuntimeError):
        pass
    raise RuntimeError(
        "the ASR server did not answer (not running, not ready, or it refused the file); "
        "start the stack with `cascade up`"
    )


def served_version(settings: Settings, *, timeout_s: float = 10.0) -> str | None:
    """The registry version the ASR server transcribes with, None while down or not ready
    (a half-second probe tone; the response names its ``model_version``)."""
    return client(settings).served_version(request_body(probe_tone()), timeout_s=timeout_s)


def _registry_champion(settings: Settings, model_name: str) -> str | None:
    from serving.champion import champion_version

    return champion_version(settings, model_name)


def roll_out(
    settings: Settings,
    ds: str,
    decision: Mapping[str, Any],
    *,
    timeout_s: float = 300,
    poll_s: float = 2.0,
    champion_version: Callable[[Settings, str], str | None] | None = None,
) -> dict[str, Any]:
    """Wait until the ASR server transcribes with the registry's champion; ``decision`` is the
    register step's for ``ds``, so a challenger that was not promoted says why it is not the
    one served. TimeoutError when the server does not serve the champion within
    ``timeout_s``, RuntimeError when the registry has no champion."""
    champion = (champion_version or _registry_champion)(settings, MODEL_NAME)
    if champion is None:
        raise RuntimeError(
            f"the registry has no '{MODEL_NAME}@champion' to deploy; the challenger of ds={ds} "
            f"was refused: {'; '.join(decision.get('reasons') or [])}"
        )
    rolled_out = wait_until_served(
        champion,
        lambda: served_version(settings),
        url=client(settings).url,
        ds=ds,
        timeout_s=timeout_s,
        poll_s=poll_s,
        hint=f"check that the ASR server runs (cascade asr serve) and its log under "
        f"{settings.logs_dir}",
    )
    return {
        "ds": ds,
        **rolled_out,
        "challenger_version": decision.get("version"),
        "promoted": decision.get("promoted"),
        "blocked_by": decision.get("reasons") or [],
    }
