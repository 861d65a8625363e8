"""The stack's own bearer token for its model servers when auth is on and none is configured."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cascade.config import load_settings
from cascade.serving_token import (
    TOKEN_VAR,
    ensure_serving_token,
    serving_token_env,
    token_file,
    use_serving_token,
)


def test_generated_once_kept_private_and_handed_on(tmp_path: Path) -> None:
    settings = load_settings({"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster"})
    assert serving_token_env(settings) == {}  # nothing before the first start
    path = ensure_serving_token(settings)
    assert path == token_file(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text()
    assert len(token) >= 32
    assert ensure_serving_token(settings) == path and path.read_text() == token  # kept
    assert serving_token_env(settings) == {TOKEN_VAR: token}
    # With the token in the environment the servers and clients agree on it.
    clustered = load_settings(
        {"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster", **serving_token_env(settings)}
    )
    assert clustered.serving.auth_headers() == {"Authorization": f"Bearer {token}"}


def test_a_readable_token_file_is_replaced(tmp_path: Path) -> None:
    settings = load_settings({"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster"})
    path = ensure_serving_token(settings)
    old = path.read_text()
    path.chmod(0o644)
    ensure_serving_token(settings)
    assert path.read_text() != old and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_none_when_auth_is_off_or_a_token_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = load_settings({"CASCADE_HOME": str(tmp_path)})
    assert ensure_serving_token(local) is None and not token_file(local).exists()
    given = load_settings(
        {"CASCADE_HOME": str(tmp_path), "CASCADE_PROFILE": "cluster", TOKEN_VAR: "mine"}
    )
    assert ensure_serving_token(given) is None and serving_token_env(given) == {}
    monkeypatch.delenv(TOKEN_VAR, raising=False)
    assert not use_serving_token(given) and TOKEN_VAR not in os.environ
