"""``cascade up`` against a real cluster: start nothing, check that each configured service
answers.

With ``CASCADE_PROFILE=cluster`` and any configured service on a host that is not this
machine's loopback, the services are someone else's: ``cascade up`` must not start local
copies beside them. It opens a TCP connection to every configured ``host:port`` instead and
prints one line per endpoint; anything unreachable makes it exit 3 (not ready). Host names are
not resolved to decide what is remote: only ``localhost`` and loopback addresses count as this
machine.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cascade.config import Settings
from cascade.errors import NotReady

DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432, "redis": 6379}


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name} {self.host}:{self.port}"


class ClusterUnreachable(NotReady):
    """A configured service of the cluster profile does not accept connections."""


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url_endpoint(name: str, url: str) -> Endpoint:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{name}: {url!r} names no host")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.split("+")[0])
    if port is None:
        raise ValueError(f"{name}: {url!r} names no port")
    return Endpoint(name, parts.hostname, port)


def _host_port(name: str, value: str, default_port: int) -> Endpoint:
    value = value.strip()
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, ""
    if port and not port.isdigit():
        raise ValueError(f"{name}: {value!r} is not HOST or HOST:PORT")
    return Endpoint(name, host.strip("[]"), int(port) if port else default_port)


def endpoints(settings: Settings) -> list[Endpoint]:
    """Every service the settings point at, as ``host:port`` (secrets never included)."""
    found = [
        _host_port(f"kafka[{i}]", server, 9092)
        for i, server in enumerate(settings.bootstrap_servers.split(","))
        if server.strip()
    ]
    found.append(_url_endpoint("mlflow", settings.tracking_uri))
    master = settings.spark_master
    if master.startswith("k8s://"):
        found.append(_url_endpoint("spark", master.removeprefix("k8s://")))
    elif master.startswith("spark://"):
        found += [
            _host_port(f"spark[{i}]", hp, 7077)
            for i, hp in enumerate(master.removeprefix("spark://").split(","))
        ]
    redis = settings.feature_store.redis
    if redis:
        # Feast's form is "host:port,password=...,ssl=true"; a redis:// URL works too.
        first = redis.split(",", 1)[0]
        found.append(
            _url_endpoint("redis", first)
            if "://" in first
            else _host_port("redis", first, DEFAULT_PORTS["redis"])
        )
    registry = settings.feature_store.feast_registry_url
    if registry and "://" in registry and not registry.startswith(("file:", "sqlite:")):
        found.append(_url_endpoint("feast registry", registry))
    if not is_loopback(settings.host):
        found += [
            Endpoint("airflow", settings.host, settings.ports.airflow),
            Endpoint("serving", settings.host, settings.ports.serving),
            Endpoint("asr_serving", settings.host, settings.ports.asr_serving),
        ]
    return found


def remote(settings: Settings) -> bool:
    """True when ``cascade up`` must check a cluster rather than start services: the cluster
    profile, with at least one configured service on a host other than loopback."""
    return settings.profile == "cluster" and any(
        not is_loopback(e.host) for e in endpoints(settings)
    )


def reachable(endpoint: Endpoint, timeout_s: float = 2.0) -> str | None:
    """None when ``endpoint`` accepts a TCP connection, else why not (one phrase)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    except TimeoutError:
        return f"no answer in {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def check(
    settings: Settings, *, echo: Callable[[str], None] = print, timeout_s: float = 2.0
) -> list[Endpoint]:
    """Report each endpoint on one line; raise :class:`ClusterUnreachable` naming the ones that
    did not answer."""
    echo("profile cluster, remote services: starting nothing here, checking each one")
    down: list[tuple[Endpoint, str]] = []
    listed = endpoints(settings)
    for endpoint in listed:
        why = reachable(endpoint, timeout_s)
        echo(f"  {endpoint.name:<15} {endpoint.host}:{endpoint.port:<6} {why or 'reachable'}")
        if why:
            down.append((endpoint, why))
    if down:
        raise ClusterUnreachable(
            f"{len(down)} of {len(listed)} cluster services unreachable: "
            + "; ".join(f"{e} ({why})" for e, why in down)
        )
    return listed
