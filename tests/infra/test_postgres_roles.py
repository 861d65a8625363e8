"""The cluster stack's PostgreSQL gives each database its own role: a client signed in for one
database can use it and no other, and the superuser's URL is the stack's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cascade import data_services
from cascade.config import Settings
from infra import services, stack


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    home = tmp_path_factory.mktemp("postgres-roles-home")
    with stack.private_stack(
        home, services=("postgres",), env={"CASCADE_PROFILE": "cluster"}
    ) as settings:
        yield settings


def connect(url: str):  # type: ignore[no-untyped-def]
    import psycopg2

    conn = psycopg2.connect(url, connect_timeout=10)
    conn.autocommit = True
    return conn


def test_each_database_is_its_roles_only(postgres: Settings) -> None:
    import psycopg2

    settings = postgres
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


def test_set_up_is_idempotent_and_hands_over_what_the_superuser_made(postgres: Settings) -> None:
    settings = postgres
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
