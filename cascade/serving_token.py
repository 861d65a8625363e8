"""The bearer token of the stack's own model servers when serving auth is on.

With ``CASCADE_SERVING_AUTH=1`` (the ``cluster`` profile's default) every request to a model
server but its health probes must carry ``Authorization: Bearer TOKEN``. A deployment hands the
servers and their clients ``CASCADE_SERVING_TOKEN`` (a Kubernetes secret, say). The stack
started by ``cascade up`` on this machine needs one too: when auth is on and no token is set, a
token is generated at the first start into a secret file of the state folder
(``serving/token``, 0600) and kept. The stack hands it to every service it starts (so the
servers check it and Airflow's deploy steps send it), and :func:`use_serving_token` exports it in
a process of its own (the CLI), so ``cascade score`` authenticates like the tasks do. Logs,
status lines and summaries name the file, never the token.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cascade.config import Settings
from cascade.state import narrow_secret, write_secret

TOKEN_VAR = "CASCADE_SERVING_TOKEN"


def token_file(settings: Settings) -> Path:
    return settings.home / "serving" / "token"


def needs_stack_token(settings: Settings) -> bool:
    """Auth is on and no token is configured: the stack's own token stands in."""
    return settings.serving.auth and not settings.serving.token


def ensure_serving_token(settings: Settings) -> Path | None:
    """Write the stack's token (0600) if auth is on, none is configured and none was written;
    a token file that others could read is replaced. None when no stack token is needed."""
    if not needs_stack_token(settings):
        return None
    path = token_file(settings)
    exposed = narrow_secret(path)
    if exposed or not path.exists() or not path.read_text().strip():
        write_secret(path, secrets.token_urlsafe(32))
    return path


def serving_token_env(settings: Settings) -> dict[str, str]:
    """``{CASCADE_SERVING_TOKEN: token}`` from the stack's file when it stands in; else empty."""
    if not needs_stack_token(settings):
        return {}
    try:
        token = token_file(settings).read_text().strip()
    except OSError:
        return {}
    return {TOKEN_VAR: token} if token else {}


def use_serving_token(settings: Settings) -> bool:
    """Export the stack's token into this process's environment when it stands in; True if
    it was set."""
    found = serving_token_env(settings)
    os.environ.update(found)
    return bool(found)
