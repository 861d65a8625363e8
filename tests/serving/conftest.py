"""A real KServe model server in a subprocess, with the fakes of serving_fakes.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import serving_fakes

from cascade.config import Ports, Settings
from cascade.ports import free_port

FAKE_SERVER = Path(__file__).with_name("fake_server.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningServer:
    proc: subprocess.Popen[bytes]
    port: int
    champion_file: Path
    log_path: Path
    settings: Settings
    started_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> float:
        """SIGTERM it and return the seconds it took to exit."""
        if self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return time.monotonic() - t0


def start_server(
    workdir: Path,
    *,
    poll_s: float = 0.2,
    max_candidates: int = 10_000,
    workers: int = 1,
    env: dict[str, str] | None = None,
) -> RunningServer:
    """The fake server on a free port; ``env`` adds or overrides variables of its process."""
    port = free_port()
    champion_file = workdir / "champion.json"
    log_path = workdir / "server.log"
    env = {
        **os.environ,
        "CASCADE_HOME": str(workdir / "home"),
        "CASCADE_SERVING_PORT": str(port),
        "CASCADE_SERVING_POLL_S": str(poll_s),
        "CASCADE_SERVING_MAX_CANDIDATES": str(max_candidates),
        "CASCADE_SERVING_WORKERS": str(workers),
        "CASCADE_TEST_CHAMPION_FILE": str(champion_file),
        # The fake server imports serving_fakes from this folder.
        "PYTHONPATH": os.pathsep.join([str(FAKE_SERVER.parent), str(REPO_ROOT)]),
        **(env or {}),
    }
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE_SERVER)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = RunningServer(
        proc=proc,
        port=port,
        champion_file=champion_file,
        log_path=log_path,
        settings=Settings(home=workdir / "home", ports=Ports(serving=port)),
        started_s=0.0,
    )
    deadline = t0 + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"fake model server exited with {proc.returncode}:\n{server.log()}")
        try:
            if requests.get(f"{server.url}/v2/health/live", timeout=1).status_code == 200:
                server.started_s = time.monotonic() - t0
                return server
        except (requests.ConnectionError, requests.Timeout):  # listening, not yet accepting
            pass
        time.sleep(0.1)
    server.stop()
    pytest.fail(f"fake model server not live after 60 s:\n{server.log()}")


@pytest.fixture(scope="session")
def champion_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose champion is version "1" for the whole session (nobody promotes here)."""
    workdir = tmp_path_factory.mktemp("serving")
    serving_fakes.write_champion(workdir / "champion.json", "1", seed=1)
    server = start_server(workdir, max_candidates=2_000)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready = requests.get(f"{server.url}/v2/models/preranking/ready", timeout=2)
        if ready.status_code == 200:
            break
        time.sleep(0.1)
    else:
        server.stop()
        pytest.fail(f"model never became ready:\n{server.log()}")
    yield server
    server.stop()
