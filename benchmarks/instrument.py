"""Store round-trip counters inside a worker process, at the driver boundary (loaded by the bench app when
``FENCE_BENCH_COUNT_DIR`` is set; never in a throughput run).

- PostgreSQL: every psycopg ``Cursor.execute``/``executemany`` (one round trip each in autocommit), the
  ``BEGIN`` psycopg sends by itself before a statement outside autocommit (a round trip of its own, outside
  pipeline mode), every ``commit``/``rollback`` that actually has a transaction to end, and every query a
  run's transaction sends straight to libpq with its ``BEGIN`` or its ``COMMIT``
  (:mod:`celery_fence.stores.sql.one_trip`, no cursor: counted where it is sent); SQLite: every
  ``sqlite3`` cursor ``execute``/``executemany``, the ``BEGIN`` the driver opens by itself before a write
  outside autocommit, and every ``commit``/``rollback`` that ends a transaction (in-process: statements,
  not network round trips);
- Redis: every command written to a socket of the store's server (``Connection.send_packed_command``);
- etcd: every HTTP request sent to the store's endpoint (``http.client.HTTPConnection.request``, which the
  store's keep-alive connections use; resends included).

After each task, the process writes ``<dir>/<pid>.json``: ``{"tasks": n, "total": n, "by_kind": {...}}``.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery.signals import task_postrun

_counts: Counter[str] = Counter()
_tasks = [0]
_installed: set[tuple[str, str]] = set()


def _kind(statement: str) -> str:
    words = re.sub(r"\s+", " ", statement).strip().split(" ")
    return "sql " + " ".join(words[:3])[:48]


def _count(kind: str) -> None:
    _counts[kind] += 1


def _install_psycopg() -> None:
    import psycopg
    from psycopg.pq import TransactionStatus

    from celery_fence.stores.sql import one_trip

    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    commit, rollback = psycopg.Connection.commit, psycopg.Connection.rollback

    def implicit_begin(cursor: Any) -> None:
        conn = cursor.connection
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if idle and not conn.autocommit and getattr(conn, "_pipeline", None) is None:
            _count("sql BEGIN (implicit)")

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        implicit_begin(self)
        _count(_kind(str(query)))
        return execute(self, query, *args, **kwargs)

    def counted_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        implicit_begin(self)
        _count(_kind(str(query)))
        return executemany(self, query, *args, **kwargs)

    def ending(original: Any, name: str) -> Any:
        def end(self: Any) -> Any:
            if self.info.transaction_status != TransactionStatus.IDLE:
                _count(name)
            return original(self)

        return end

    def counted_send(self: Any, query: bytes) -> Any:
        _count(_kind(query.decode(errors="replace").split("(", 1)[0]))  # its arguments left out
        return send(self, query)

    send = one_trip._Wire.send
    one_trip._Wire.send = counted_send  # type: ignore[method-assign]
    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
    psycopg.Connection.commit = ending(commit, "sql COMMIT")  # type: ignore[method-assign]
    psycopg.Connection.rollback = ending(rollback, "sql ROLLBACK")  # type: ignore[method-assign]


def _install_sqlite() -> None:
    """sqlite3's types cannot be patched: every SQLite connection SQLAlchemy opens from now on is made by a
    counting ``sqlite3.Connection`` subclass (the store runs its hot statements on the driver's cursor,
    which SQLAlchemy's execute events never see)."""
    import sqlite3

    from sqlalchemy import Engine, event

    writes = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    class Cursor(sqlite3.Cursor):
        def _begin(self, sql: str) -> None:
            conn = self.connection
            implicit = conn.isolation_level is not None and not conn.in_transaction
            if implicit and sql.lstrip().upper().startswith(writes):
                _count("sql BEGIN (implicit)")

        def execute(self, sql: str, *args: Any) -> Any:
            self._begin(sql)
            _count(_kind(sql))
            return super().execute(sql, *args)

        def executemany(self, sql: str, *args: Any) -> Any:
            self._begin(sql)
            _count(_kind(sql))
            return super().executemany(sql, *args)

    class Connection(sqlite3.Connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            return super().cursor(Cursor)

        def commit(self) -> None:
            if self.in_transaction:
                _count("sql COMMIT")
            super().commit()

        def rollback(self) -> None:
            if self.in_transaction:
                _count("sql ROLLBACK")
            super().rollback()

    def on_connect(dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        if dialect.name == "sqlite":
            cparams["factory"] = Connection

    event.listen(Engine, "do_connect", on_connect)


def _install_redis(port: int) -> None:
    from redis.connection import Connection

    original = Connection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        if self.port == port:
            parts = command if isinstance(command, list) else [command]
            name = b"".join(bytes(p) for p in parts).split(b"\r\n")[2].decode(errors="replace").upper()
            _count(f"redis {name}")
        original(self, command, check_health)

    Connection.send_packed_command = counting  # type: ignore[method-assign]


def _install_etcd(netloc: str) -> None:
    from http.client import HTTPConnection

    original = HTTPConnection.request

    def counting(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        if f"{self.host}:{self.port}" == netloc:
            _count(f"etcd {url}")
        original(self, method, url, *args, **kwargs)

    HTTPConnection.request = counting  # type: ignore[method-assign]


def count_round_trips(store_url: str) -> Counter[str]:
    """Count, in this process, every round trip to the store at ``store_url``: the live counter."""
    scheme = store_url.split("://", 1)[0].split("+", 1)[0]
    where = urlsplit(store_url).netloc if scheme in ("redis", "etcd") else ""
    if (scheme, where) in _installed:
        return _counts
    _installed.add((scheme, where))
    if scheme == "postgresql":
        _install_psycopg()
    elif scheme == "sqlite":
        _install_sqlite()
    elif scheme == "redis":
        _install_redis(urlsplit(store_url).port or 6379)
    elif scheme == "etcd":
        _install_etcd(urlsplit(store_url).netloc)
    return _counts


def install(directory: Path) -> None:
    """In a worker: count, and write the counts after each task (the round trips to the lease store, and
    to the database of the variants' rows, ``FENCE_BENCH_ROWS_URL``, when it is set)."""
    for url in (os.environ.get("FENCE_BENCH_STORE", ""), os.environ.get("FENCE_BENCH_ROWS_URL", "")):
        if url:
            count_round_trips(url)

    @task_postrun.connect(weak=False)
    def _dump(**_: Any) -> None:
        _tasks[0] += 1
        data = {"tasks": _tasks[0], "total": sum(_counts.values()), "by_kind": dict(_counts)}
        path = directory / f"{os.getpid()}.json"
        path.with_suffix(".tmp").write_text(json.dumps(data))
        path.with_suffix(".tmp").replace(path)
