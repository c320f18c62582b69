"""The contract suite on a PostgreSQL primary and synchronous standby, through a libpq multi-host URL that
lists the standby first (``target_session_attrs=read-write`` must skip it on every connection).

Not in ``make test`` (it would run the PostgreSQL half of the suite twice): ``make contract-pg-ha`` sets
``FENCE_TEST_PG_HA=1``, which adds this harness as ``postgresql-ha``. One pair serves the whole session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence.stores.front import checked
from celery_fence.testing import StoreHarness as Harness

from ...servers.pg_pair import PostgresPair, multi_host_url, postgres_pair
from .sql import _sql_expire, pg_schema_store

__all__ = ["HARNESS"]

_started: list[PostgresPair] = []


def _pair(request: pytest.FixtureRequest) -> PostgresPair:
    if not _started:
        pairs = postgres_pair(synchronous=True)
        _started.append(pairs.__enter__())
        request.config.add_cleanup(lambda: pairs.__exit__(None, None, None))
    return _started[0]


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    pair = _pair(request)
    with pg_schema_store(multi_host_url(pair.ports[::-1])) as store:
        yield checked(store)


HARNESS = Harness("postgresql-ha", _open, _sql_expire)
