"""Run a command with parts of the state folder hidden from it: how the cluster profile's
ordinary Celery workers run beside the promotion worker on one host.

    python -m infra.worker_confinement --hide DIR [--hide DIR ...] [--keep FILE ...] -- COMMAND

Every service of the one-host stack runs as one OS user, so file modes cannot keep a task away
from the promoter's credential or the release signing key. This launcher gives ``COMMAND`` its
own user, mount and PID namespaces (Linux; no privilege needed where unprivileged user
namespaces are allowed) in which:

- each ``--hide`` folder is covered by an empty, read-only tmpfs: files created there later on
  the host stay hidden too (a file written atomically replaces its directory entry, which a mount on
  the file itself would no longer cover);
- each ``--keep`` file (inside a hidden folder) is bound back in place, read-only: the release
  key's public half stays readable while its private half is hidden;
- ``/proc`` is the namespace's own, so no other process of the host, and so no path through
  ``/proc/PID/root`` to the files it sees, is visible;
- the command runs in a further user and mount namespace, which locks those mounts: not even
  root inside can unmount them.

The namespace's first process is a small init of this module (it reaps the orphans a worker's
task processes leave); the command is its child. The launcher stays outside the namespace,
forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT (the init passes them on to the command), exits
with the command's status, and takes the namespace along when it is killed itself (the init's
parent-death signal is SIGKILL, and the init's end ends every process in its namespace), so a
supervisor stops the command by the launcher's pid.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
FAILED = 126
"""The launcher's exit status when the namespaces or mounts cannot be made."""


class ConfinementError(OSError):
    """The namespaces or mounts could not be made; the message names the step."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise ConfinementError(errno, f"worker confinement: {what}: {os.strerror(errno)}")


def _enter_user_namespace(libc: ctypes.CDLL, flags: int) -> None:
    """Unshare ``flags`` with a new user namespace that maps this process's user and group to
    themselves (files keep their owner; nothing else is mapped)."""
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | flags), "unshare (user namespaces not allowed here?)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _mount(libc: ctypes.CDLL, source: str, target: str, kind: str | None, flags: int,
           data: str | None = None) -> None:  # fmt: skip
    _check(
        libc.mount(
            source.encode(),
            target.encode(),
            kind.encode() if kind else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _hide(libc: ctypes.CDLL, hide: Sequence[Path], keep: Sequence[Path]) -> None:
    """In this (new) mount namespace: a fresh /proc, an empty tmpfs over each hidden folder, the
    kept files bound back read-only."""
    _mount(libc, "none", "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # Opened before the folders are covered: the kept files are bound from these.
    kept = {path: os.open(path, os.O_PATH) for path in keep if path.exists()}
    for folder in hide:
        _mount(libc, "cascade-hidden", str(folder), "tmpfs", MS_NOSUID | MS_NODEV,
               "size=64k,mode=0700")  # fmt: skip
    for path, fd in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        _mount(libc, f"/proc/self/fd/{fd}", str(path), None, MS_BIND)
        _mount(libc, "none", str(path), None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    # Read-only once filled: a step that would make a key or a credential there fails at once
    # instead of writing one nobody else sees.
    for folder in hide:
        _mount(
            libc, "cascade-hidden", str(folder), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        )


def _forward_to(pid: int) -> None:
    """Pass the stop signals this process gets on to ``pid``."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)


def _wait_for(pid: int) -> int:
    """Reap every child until ``pid`` exits (a namespace's first process adopts its orphans);
    ``pid``'s exit status, 128 + N when signal N ended it."""
    while True:
        try:
            found, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return FAILED
        if found == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _namespace_init(libc: ctypes.CDLL, hide: Sequence[Path], keep: Sequence[Path],
                    command: Sequence[str], report: int) -> int:  # fmt: skip
    """The PID namespace's first process: hide, lock, then run ``command`` as its child, pass
    stop signals on, reap orphans, and exit with the command's status (which ends every
    process left in the namespace). Set-up errors go to ``report``."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _hide(libc, hide, keep)
        # Mounts made in a namespace that a less privileged one copies are locked there; this
        # process enters it too, so none in the namespace holds a right over the mounts.
        _enter_user_namespace(libc, CLONE_NEWNS)
    except OSError as exc:
        os.write(report, str(exc).encode()[:500])
        return FAILED
    os.close(report)
    child = os.fork()
    if child == 0:
        try:
            os.execvp(command[0], list(command))
        except OSError as exc:
            print(f"worker confinement: cannot run {command[0]}: {exc}", file=sys.stderr)
        os._exit(FAILED + 1)
    _forward_to(child)
    return _wait_for(child)


def _run_confined(hide: Sequence[Path], keep: Sequence[Path], command: Sequence[str]) -> int:
    libc = _libc()
    for folder in hide:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _enter_user_namespace(libc, CLONE_NEWNS | CLONE_NEWPID)
    # The next child is the PID namespace's first process.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os._exit(_namespace_init(libc, hide, keep, command, write_end))
    os.close(write_end)
    _forward_to(pid)
    error = b""
    while chunk := os.read(read_end, 512):
        error += chunk
    os.close(read_end)
    if error:
        print(error.decode(errors="replace"), file=sys.stderr, flush=True)
    return _wait_for(pid)


def confined_command(
    hide: Sequence[Path], keep: Sequence[Path], command: Sequence[str]
) -> list[str]:
    """``command`` run by this launcher with ``hide`` covered and ``keep`` bound back (paths
    only: no secret is ever an argument)."""
    return [
        sys.executable,
        "-m",
        __name__ if __name__ != "__main__" else "infra.worker_confinement",
        *(arg for folder in hide for arg in ("--hide", str(folder))),
        *(arg for path in keep for arg in ("--keep", str(path))),
        "--",
        *command,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hide", action="append", default=[], type=Path)
    parser.add_argument("--keep", action="append", default=[], type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    if not sys.platform.startswith("linux"):
        print("worker confinement: needs Linux namespaces", file=sys.stderr)
        return FAILED
    try:
        return _run_confined(args.hide, args.keep, command)
    except OSError as exc:
        print(exc, file=sys.stderr)
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
