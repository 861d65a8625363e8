"""The cluster stack's data services sign each client in as its own role: PostgreSQL gives each
database its own role (a client signed in for one database can use it and no other; the
superuser's URL is the stack's own), Redis has a read-only user for the model servers and asks
everyone else for the writers' password."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cascade import data_services
from cascade.config import Settings
from infra import services, stack


@pytest.fixture(scope="module")
def data_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("postgres-roles-home")
    with stack.private_stack(
        home, services=("postgres", "redis"), env={"CASCADE_PROFILE": "cluster"}
    ) as settings:
        yield settings


def connect(url: str):  # type: ignore[no-untyped-def]
    import psycopg2

    conn = psycopg2.connect(url, connect_timeout=10)
    conn.autocommit = True
    return conn


def test_each_database_is_its_roles_only(data_stack: Settings) -> None:
    import psycopg2

    settings = data_stack
    for database, role in data_services.DATABASE_ROLES.items():
        url = data_services.stack_postgres_url(settings, database)
        conn = connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE IF NOT EXISTS probe (n int)")
                cur.execute(
                    "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = %s", (role,)
                )
                assert cur.fetchone() == (role, False)
        finally:
            conn.close()
        for other in data_services.DATABASE_ROLES:
            if other == database:
                continue
            # The role's own password, another database: refused at sign-in.
            with pytest.raises(psycopg2.OperationalError, match="permission denied"):
                connect(url.rsplit("/", 1)[0] + f"/{other}")


def test_set_up_is_idempotent_and_hands_over_what_the_superuser_made(data_stack: Settings) -> None:
    settings = data_stack
    conn = connect(data_services.superuser_postgres_url(settings, "airflow"))
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE made_before_roles (n serial primary key)")
    finally:
        conn.close()
    assert services.ensure_databases(settings) == []
    conn = connect(data_services.stack_postgres_url(settings, "airflow"))
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO made_before_roles DEFAULT VALUES")
            cur.execute("DROP TABLE made_before_roles")  # only its owner may
    finally:
        conn.close()
    # The superuser's password is in no service's environment.
    superuser = Path(data_services.postgres_password_file(settings)).read_text().strip()
    for name, spec in services.service_specs(settings).items():
        assert not any(superuser in value for value in spec.env.values()), name


def test_redis_servers_read_only_and_nobody_signs_in_without_a_password(
    data_stack: Settings,
) -> None:
    import redis

    settings = data_stack
    host, port = settings.host, settings.ports.redis
    writer = redis.Redis(
        host=host,
        port=port,
        password=data_services.redis_password_file(settings).read_text().strip(),
    )
    writer.hset("cascade:probe", "field", "value")
    # The servers' environment points Feast at the reader, the writers' password absent.
    env = services.service_specs(settings)["serving"].env
    connection = env["CASCADE_REDIS"]
    assert f"username={data_services.REDIS_READER}" in connection
    reader_password = connection.rsplit("password=", 1)[1]
    reader = redis.Redis(
        host=host, port=port, username=data_services.REDIS_READER, password=reader_password
    )
    assert reader.hget("cascade:probe", "field") == b"value"
    for write in (
        lambda: reader.hset("cascade:probe", "field", "planted"),
        lambda: reader.delete("cascade:probe"),
        lambda: reader.flushall(),
        lambda: reader.config_set("requirepass", ""),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            write()
    assert writer.hget("cascade:probe", "field") == b"value"
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=host, port=port).ping()
    assert "CASCADE_REDIS" not in services.service_specs(settings)["airflow"].env
