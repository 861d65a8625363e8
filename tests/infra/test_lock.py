"""The lock (infra/requirements.lock) pins the whole environment with hashes, covers what
pyproject.toml asks for, is what is installed, and is what infra/install.sh installs; the
generator (infra/lock.py) keeps only the files pip could install here. No network."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from cascade.config import REPO_ROOT
from infra import lock as lockgen

LOCK_TEXT = (REPO_ROOT / "infra" / "requirements.lock").read_text()
INSTALL = (REPO_ROOT / "infra" / "install.sh").read_text()
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
ENTRY = re.compile(r"^(?P<name>[a-z0-9]+(?:-[a-z0-9]+)*)==(?P<version>\S+)$")
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")
# Installed on purpose without (some of) their declared dependencies; infra/install.sh says why.
NO_DEPS = {"kserve": {"psutil"}, "recbole": None}


def parse(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes); fails on any line that is not a pinned, hashed requirement."""
    entries: dict[str, tuple[str, list[str]]] = {}
    logical = re.sub(r"\\\n", " ", text)
    for number, line in enumerate(logical.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        head, *options = line.split()
        match = ENTRY.match(head)
        assert match, f"line {number}: not `name==version`: {head!r}"
        assert options and all(HASH.match(o) for o in options), f"line {number}: {line[:120]}"
        name = match["name"]
        assert name == canonicalize_name(name) and name not in entries, f"line {number}: {name}"
        Version(match["version"])  # a valid version, nothing looser
        entries[name] = (match["version"], [o.split(":", 1)[1] for o in options])
    return entries


LOCKED = parse(LOCK_TEXT)


def test_every_entry_is_pinned_with_a_sha256() -> None:
    assert len(LOCKED) > 200
    # The editable project is installed from the work tree, never from the lock.
    assert canonicalize_name(PYPROJECT["project"]["name"]) not in LOCKED
    # torch is PyPI's build, whose CUDA libraries come pinned and hashed beside it (it imports
    # them at start-up, on a machine with no GPU too).
    assert not LOCKED["torch"][0].endswith("+cpu")
    for name in ("pip", "setuptools", "kserve", "recbole", "triton", "nvidia-cublas"):
        assert name in LOCKED, name
    # The emulator and the second Kafka client are gone: Apache Kafka, through confluent-kafka.
    for name in ("noida-db", "kafka-python"):
        assert name not in LOCKED, name


def test_the_parser_rejects_an_unpinned_or_unhashed_line() -> None:
    good = "six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    assert parse(good) == {"six": ("1.17.0", ["a" * 64])}
    for bad in (
        "six>=1.17 \\\n    --hash=sha256:" + "a" * 64,
        "six==1.17.0",
        "six==1.17.0 --hash=md5:ab",
    ):
        with pytest.raises(AssertionError):
            parse(bad + "\n")


def requested() -> list[Requirement]:
    project = PYPROJECT["project"]
    return [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]
    ]


def test_the_lock_covers_every_requirement_of_pyproject() -> None:
    for req in requested():
        if req.marker and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in LOCKED, f"{req} is not in the lock: install it, then `make lock`"
        version = LOCKED[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{req}: lock has {version}"


def test_every_locked_package_has_its_dependencies_locked() -> None:
    """`pip check` of the lock: each entry's dependencies (and those of the extras pyproject asks
    for) are locked at a version they accept, save the ones NO_DEPS leaves out on purpose."""
    extras: dict[str, set[str]] = {}
    for req in requested():
        extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    problems = []
    for name, (version, _) in LOCKED.items():
        if name in NO_DEPS and NO_DEPS[name] is None:
            continue
        wanted_extras = [""] + sorted(extras.get(name, ()))
        for text in importlib.metadata.requires(name) or []:
            dep = Requirement(text)
            dep_name = canonicalize_name(dep.name)
            if dep_name in (NO_DEPS.get(name) or ()):
                continue
            if dep.marker and not any(
                dep.marker.evaluate({**default_environment(), "extra": e}) for e in wanted_extras
            ):
                continue
            if dep_name not in LOCKED:
                problems.append(f"{name}=={version} needs {dep}: not locked")
            elif not dep.specifier.contains(LOCKED[dep_name][0], prereleases=True):
                problems.append(f"{name}=={version} needs {dep}: lock has {LOCKED[dep_name][0]}")
    assert not problems, "\n".join(problems)


def test_the_installed_environment_is_the_lock() -> None:
    installed = {p.name: p.version for p in lockgen.installed_pins()}
    fix = "run `make venv` to install the lock, or `make lock` after installing on purpose"
    missing = sorted(set(LOCKED) - set(installed))
    assert not missing, f"locked but not installed: {missing}; {fix}"
    extra = sorted(set(installed) - set(LOCKED))
    assert not extra, f"installed but not locked: {extra}; {fix}"
    differ = {
        n: (installed[n], v) for n, (v, _) in LOCKED.items() if Version(installed[n]) != Version(v)
    }
    assert not differ, f"installed vs locked: {differ}; {fix}"
    for name, (version, _) in LOCKED.items():
        assert Version(importlib.metadata.version(name)) == Version(version), name


def test_install_takes_every_package_from_the_lock_by_hash() -> None:
    assert 'install -q --require-hashes --no-deps --no-build-isolation -r "$LOCK"' in INSTALL
    assert "LOCK=infra/requirements.lock" in INSTALL
    installs = [
        line.strip()
        for line in INSTALL.splitlines()
        if re.search(r"\bpip\"? install\b", line, re.I) and not line.lstrip().startswith("#")
    ]
    assert len(installs) == 3, installs
    for line in installs:
        # Hash-checked, or the project itself from the work tree with no dependency.
        assert "--require-hashes" in line or line.endswith("--no-deps --no-build-isolation -e ."), (
            line
        )


def test_the_bootstrap_takes_pip_and_setuptools_entries_from_the_lock(tmp_path: Path) -> None:
    (function,) = [line for line in INSTALL.splitlines() if line.startswith("lock_entries()")]
    shown = subprocess.run(
        [
            "bash",
            "-c",
            f'{function}\nLOCK="$1"; lock_entries pip setuptools',
            "-",
            "infra/requirements.lock",
        ],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert parse(shown) == {name: LOCKED[name] for name in ("pip", "setuptools")}


# The generator, on a local index and a find-links folder made here.

LINUX = frozenset({Tag("py3", "none", "any"), Tag("cp311", "cp311", "manylinux_2_17_x86_64")})


def write_index(root: Path, name: str, files: dict[str, bytes]) -> None:
    (root / "files").mkdir(parents=True, exist_ok=True)
    links = []
    for filename, content in files.items():
        (root / "files" / filename).write_bytes(content)
        digest = hashlib.sha256(content).hexdigest()
        links.append(f'<a href="../../files/{filename}#sha256={digest}">{filename}</a>')
    (root / "simple" / name).mkdir(parents=True)
    (root / "simple" / name / "index.html").write_text(
        "<html><body>" + "\n".join(links) + "</body></html>"
    )


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_the_generator_keeps_only_files_pip_could_install_here(tmp_path: Path) -> None:
    write_index(
        tmp_path / "index",
        "fast-thing",
        {
            "fast_thing-1.2.0-cp311-cp311-manylinux_2_17_x86_64.whl": b"linux",
            "fast_thing-1.2.0-cp311-cp311-macosx_11_0_arm64.whl": b"mac",
            "fast_thing-1.2.0-cp312-cp312-manylinux_2_17_x86_64.whl": b"py312",
            "fast_thing-1.2.0.tar.gz": b"sdist",
            "fast_thing-1.3.0-py3-none-any.whl": b"newer",
            "fast_thing-1.2.0.exe": b"installer",
        },
    )
    links = tmp_path / "wheels"
    links.mkdir()
    (links / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"cpu")
    (links / "torch-2.13.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"cuda")
    pins = [
        lockgen.Pin(canonicalize_name("Fast_Thing"), "1.2"),
        lockgen.Pin(canonicalize_name("torch"), "2.13.0+cpu"),
    ]
    index = (tmp_path / "index" / "simple").as_uri()
    entries = lockgen.lock(pins, [index], [str(links)], LINUX)
    got = {e.pin.name: e.hashes for e in entries}
    assert got == {"fast-thing": {sha(b"linux"), sha(b"sdist")}, "torch": {sha(b"cpu")}}
    text = lockgen.render(entries)
    assert parse(text) == {
        "fast-thing": ("1.2", sorted([sha(b"linux"), sha(b"sdist")])),
        "torch": ("2.13.0+cpu", [sha(b"cpu")]),
    }
    assert lockgen.render(lockgen.lock(pins, [index], [str(links)], LINUX)) == text


def test_the_generator_names_a_pin_with_no_file(tmp_path: Path) -> None:
    write_index(tmp_path, "fast-thing", {"fast_thing-1.3.0-py3-none-any.whl": b"newer"})
    pins = [
        lockgen.Pin(canonicalize_name(n), v)
        for n, v in [("fast-thing", "1.2.0"), ("absent", "0.1")]
    ]
    with pytest.raises(lockgen.LockError, match=r"absent==0\.1, fast-thing==1\.2\.0"):
        lockgen.lock(pins, [(tmp_path / "simple").as_uri()], [], LINUX)
