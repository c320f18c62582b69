"""PostgreSQL's audit trail after schema 3: the acquire and complete write their own history line in the same
statement, the trigger writes every other change, and a statement of an older celery-fence (schema 2: no
line of its own) is still logged by the trigger during a rolling upgrade."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from celery_fence import TokenRewound
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.schema import SCHEMA_VERSION
from tests.support.harnesses import HARNESSES

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    for store in HARNESSES["postgresql"].open(request):
        store.migrate()
        yield store


def _events(store: SQLStore, key: str) -> list[tuple[str, int]]:
    return [(e.event, e.token) for e in store.history(key)]


def test_every_change_has_exactly_one_line(pg: SQLStore) -> None:
    first = pg.acquire("k", "a", 30.0)
    admin = pg.force_release("k")  # the trigger's line
    second = pg.acquire("k", "b", 30.0)
    pg.complete(second, 1)
    assert _events(pg, "k") == [
        ("acquire", first.token),
        ("admin-release", admin),
        ("acquire", second.token),
        ("complete", second.token),
    ]
    assert [e.detail for e in pg.history("k")] == [None, None, None, None]


def test_an_older_celery_fences_statements_are_still_logged(pg: SQLStore) -> None:
    """Schema 2's acquire and complete, exactly as that version sent them (no history line of their own)."""
    with pg.engine.begin() as conn:
        token = conn.execute(
            text(
                "INSERT INTO fence_leases (key, token, owner, expires_at, done, run, recoveries, event)"
                " SELECT 'old', nextval('fence_token_seq'), 'o', extract(epoch from clock_timestamp()) + 30,"
                " false, NULL, 0, 'acquire' RETURNING token"
            )
        ).scalar_one()
        conn.execute(
            text(
                "UPDATE fence_leases SET done = true, result = '1', expires_at = NULL,"
                " finished_at = extract(epoch from clock_timestamp()), event = 'complete', detail = NULL"
                " WHERE key = 'old'"
            )
        )
    assert _events(pg, "old") == [("acquire", token), ("complete", token)]


def test_a_rewound_counter_is_still_refused_by_the_acquire(pg: SQLStore) -> None:
    for other in ("x", "y"):
        pg.acquire(other, "a", 30.0)
    lease = pg.acquire("k", "a", 30.0)
    pg.release(lease)
    # A failover that lost the last tokens. An acquire of a known key draws two values (the INSERT's, unused
    # on the conflict, then the UPDATE's): the second one is the token this key already had.
    with pg.engine.begin() as conn:
        conn.execute(text("SELECT setval('fence_token_seq', :v, false)"), {"v": lease.token - 1})
    with pytest.raises(TokenRewound):
        pg.acquire("k", "b", 30.0)
    assert _events(pg, "k") == [("acquire", lease.token), ("release", lease.token)]


def test_a_schema_2_store_is_upgraded_in_place(pg: SQLStore) -> None:
    with pg.engine.begin() as conn:
        conn.execute(text("UPDATE fence_meta SET value = '2' WHERE name = 'schema_version'"))
    pg.migrate()
    with pg.engine.connect() as conn:
        version = conn.execute(text("SELECT value FROM fence_meta WHERE name = 'schema_version'")).scalar()
    assert version == str(SCHEMA_VERSION) == "4"
    lease = pg.acquire("k", "a", 30.0)
    pg.complete(lease, 1)
    assert _events(pg, "k") == [("acquire", lease.token), ("complete", lease.token)]
