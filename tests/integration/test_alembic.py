"""The Alembic recipe of docs/alembic.md, run with Alembic itself: the page's own env.py and migration, on a
fresh PostgreSQL schema (``fence_test_<random>``, dropped afterwards) and on a SQLite file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, create_engine, insert, select

import celery_fence.schema
from celery_fence import StaleToken, fenced_update, open_store
from tests.support.harnesses.sql import pg_schema_store

alembic = pytest.importorskip("alembic", reason="alembic is in the dev extra: pip install -e '.[dev]'")
from alembic import command  # noqa: E402
from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "alembic.md"
CELERY = Path(sys.executable).with_name("celery")
TEMPLATE = Path(alembic.__file__).parent / "templates" / "generic" / "script.py.mako"
MODELS = """\
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("status", String(20), nullable=False),
    Column("fence_token", BigInteger),
)
"""
CLI_APP = """\
from celery import Celery

app = Celery("alembicapp", broker="memory://")
app.conf.fence_store_url = {url!r}
"""


def user_metadata() -> tuple[MetaData, Table]:
    """A fresh copy of the user's models (the same text as ``myapp/models.py``)."""
    namespace: dict[str, Any] = {}
    exec(MODELS, namespace)
    return namespace["metadata"], namespace["orders"]


def doc_block(first_line: str) -> str:
    """The docs/alembic.md code block that starts with ``first_line``: the test runs what the page shows."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    found = [block for block in blocks if block.startswith(first_line + "\n")]
    assert len(found) == 1, f"docs/alembic.md has no single block starting with {first_line!r}"
    return found[0]


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a fresh PostgreSQL schema (dropped afterwards) or a new SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'app.db'}"
        return
    with pg_schema_store(request.getfixturevalue("postgres_url")) as empty:  # fails in CI without PostgreSQL
        yield empty.url


@pytest.fixture
def project(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Config:
    """A user's project: ``myapp.models`` and the migrations folder of docs/alembic.md."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "models.py").write_text(MODELS)
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(doc_block("# migrations/env.py"))
    (versions / "0001_fence_tables.py").write_text(doc_block("# migrations/versions/0001_fence_tables.py"))
    shutil.copy(TEMPLATE, tmp_path / "migrations" / "script.py.mako")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        monkeypatch.delitem(sys.modules, name)
    config = Config()
    config.set_main_option("script_location", str(tmp_path / "migrations"))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def differences(url: str, metadata: Any, **opts: Any) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True, **opts}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def tables_in(diff: list[Any]) -> set[str]:
    """Names of the tables a diff touches (its entries are tuples, or lists of tuples for modify_* ops)."""
    names = set()
    for entry in diff:
        for op in entry if isinstance(entry, list) else [entry]:
            obj = next((x for x in op if isinstance(x, Table) or hasattr(x, "table")), None)
            table = obj if isinstance(obj, Table) else getattr(obj, "table", None)
            names.add(getattr(table, "name", "?"))
    return names


FENCE_TABLES = set(celery_fence.schema.metadata.tables)


def test_the_documented_migration_makes_a_working_store_and_autogenerate_leaves_it_alone(
    project: Config, database_url: str, tmp_path: Path
) -> None:
    user, orders = user_metadata()
    before = differences(database_url, [user, celery_fence.schema.metadata])
    assert tables_in(before) == {*FENCE_TABLES, "orders"}  # the comparison sees missing tables

    command.upgrade(project, "head")  # the page's 0001: celery_fence.schema.migrate(op.get_bind())
    script = command.revision(project, message="orders", autogenerate=True, rev_id="0002")
    generated = Path(script.path).read_text()  # type: ignore[union-attr]
    assert "op.create_table('orders'" in generated
    operations = generated[generated.index("def upgrade") :]
    assert set(re.findall(r"'(fence_\w*)'", operations)) == {"fence_token"}  # none of celery-fence's tables
    command.upgrade(project, "head")

    assert differences(database_url, [user, celery_fence.schema.metadata]) == []
    include = celery_fence.schema.include_object
    assert differences(database_url, user, include_object=include) == []
    assert tables_in(differences(database_url, user)) == FENCE_TABLES  # without either: drop them all

    store = open_store(database_url)
    engine = create_engine(database_url)
    try:
        lease = store.acquire("order:1", "host:1:alembic", 30.0)
        store.save_step(lease, "reserve", {"sku": "A"})
        with engine.begin() as conn:
            conn.execute(insert(orders).values(id=1, status="new", fence_token=None))
            fenced_update(conn, orders, {"status": "paid"}, orders.c.id == 1, lease.token)
        store.complete(lease, {"order": 1})
        state = store.get("order:1")
        assert state is not None and state.done and state.token == lease.token
        assert [e.event for e in store.history("order:1")] == ["acquire", "step", "complete"]
        newer = store.acquire("order:1:refund", "host:2:alembic", 30.0)  # tokens only go up, store-wide
        assert newer.token > lease.token
        with engine.begin() as conn:
            fenced_update(conn, orders, {"status": "refunded"}, orders.c.id == 1, newer.token)
        with engine.begin() as conn, pytest.raises(StaleToken):
            fenced_update(conn, orders, {"status": "stale"}, orders.c.id == 1, lease.token)
        with engine.connect() as conn:
            row = conn.execute(select(orders.c.status, orders.c.fence_token)).one()
        assert tuple(row) == ("refunded", newer.token)
    finally:
        store.close()
        engine.dispose()

    command.upgrade(project, "head")  # applied again: nothing to do
    command.downgrade(project, "0001_fence_tables")  # drops the user's table only
    with create_engine(database_url).connect() as conn:
        assert conn.dialect.has_table(conn, "fence_leases") and not conn.dialect.has_table(conn, "orders")


def test_the_cli_migration_matches_the_metadata(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "alembicapp.py").write_text(CLI_APP.format(url=database_url))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    result = subprocess.run(
        [str(CELERY), "-A", "alembicapp", "fence", "migrate"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fence schema is up to date on ")
    assert differences(database_url, celery_fence.schema.metadata) == []
    user, _ = user_metadata()
    assert tables_in(differences(database_url, user)) == {*FENCE_TABLES, "orders"}
    include = celery_fence.schema.include_object
    assert tables_in(differences(database_url, user, include_object=include)) == {"orders"}


def test_include_object_keeps_a_user_tables_fence_token_column() -> None:
    _, orders = user_metadata()
    include = celery_fence.schema.include_object
    assert include(orders.c.fence_token, "fence_token", "column", False, None)
    assert include(orders, "orders", "table", False, None)
    fence_leases = celery_fence.schema.metadata.tables["fence_leases"]
    assert not include(fence_leases, "fence_leases", "table", True, None)
    assert not include(fence_leases.c.token, "token", "column", True, None)
    index = next(iter(fence_leases.indexes))
    assert not include(index, index.name, "index", True, None)
