"""The fence an engineer writes by hand: two psycopg statements per task.

1. acquire: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING token``, the token from a
   sequence (``nextval``); no row back means the key is held or done: skip the run;
2. complete: ``UPDATE ... SET done, result WHERE key AND token`` (releases the lease and stores the result);
   no row updated means a newer token took over: the run's result is refused.

One connection per worker process (opened after fork, kept), with psycopg's defaults: ``autocommit`` off,
so each statement is committed by ``conn.commit()`` (psycopg sends ``BEGIN``, the statement, ``COMMIT``).
``autocommit=True`` gives the tightest possible form, one round trip per statement; the benchmark runs both.

:func:`fenced_write` is the same fence around a body that writes one row, as an engineer would put the row
under it: the acquire in autocommit, then the row's ``INSERT`` and the completion's ``UPDATE`` in one
transaction (psycopg's ``BEGIN``, the two statements, ``COMMIT``: 5 round trips with the acquire), rolled
back when the completion matches no row. PostgreSQL only (no SQLite twin).
Table and sequence: ``fence_bench_handwritten`` and ``fence_bench_handwritten_seq`` in the run's schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import psycopg

DDL = """
CREATE SEQUENCE IF NOT EXISTS fence_bench_handwritten_seq;
CREATE TABLE IF NOT EXISTS fence_bench_handwritten (
  key text PRIMARY KEY,
  token bigint NOT NULL,
  owner text,
  expires_at timestamptz,
  done boolean NOT NULL DEFAULT false,
  result text
)"""
ACQUIRE = """
INSERT INTO fence_bench_handwritten AS f (key, token, owner, expires_at)
VALUES (%(key)s, nextval('fence_bench_handwritten_seq'), %(owner)s,
        clock_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (key) DO UPDATE
  SET token = nextval('fence_bench_handwritten_seq'), owner = excluded.owner, expires_at = excluded.expires_at
  WHERE NOT f.done AND f.expires_at <= clock_timestamp()
RETURNING token"""
COMPLETE = """
UPDATE fence_bench_handwritten SET done = true, result = %(result)s, expires_at = NULL
WHERE key = %(key)s AND token = %(token)s AND NOT done"""

INSERT_ROW = "INSERT INTO fence_bench_tx (key, i) VALUES (%(key)s, %(i)s)"

_connections: dict[tuple[int, bool], psycopg.Connection[Any]] = {}


class Refused(Exception):
    """The guarded complete matched no row: a newer token owns the key."""


def connection(autocommit: bool) -> psycopg.Connection[Any]:
    """This process's connection (a forked child opens its own)."""
    slot = (os.getpid(), autocommit)
    conn = _connections.get(slot)
    if conn is None or conn.closed:
        conn = _connections[slot] = psycopg.connect(os.environ["FENCE_BENCH_PG_DSN"], autocommit=autocommit)
    return conn


def fenced(key: str, owner: str, body: Callable[[], Any], ttl: float = 30.0, autocommit: bool = False) -> Any:
    """Run ``body`` under the hand-written fence; ``None`` (body not run) when the key is held or done."""
    conn = connection(autocommit)
    row = conn.execute(ACQUIRE, {"key": key, "owner": owner, "ttl": ttl}).fetchone()
    if not autocommit:
        conn.commit()
    if row is None:
        return None
    result = body()
    params = {"key": key, "token": row[0], "result": json.dumps(result)}
    updated = conn.execute(COMPLETE, params).rowcount
    if not autocommit:
        conn.commit()
    if updated != 1:
        raise Refused(f"{key}: token {row[0]} was superseded")
    return result


def fenced_write(key: str, owner: str, i: int, body: Callable[[], Any], ttl: float = 30.0) -> Any:
    """Acquire (autocommit), then ``fence_bench_tx``'s row and the completion in one transaction: the row
    commits with the completion or not at all. ``None`` when the key is held or done."""
    conn = connection(True)  # this process's autocommit connection, out of autocommit for the transaction
    row = conn.execute(ACQUIRE, {"key": key, "owner": owner, "ttl": ttl}).fetchone()
    if row is None:
        return None
    result = body()
    conn.autocommit = False  # idle: no round trip; psycopg sends BEGIN before the INSERT
    try:
        conn.execute(INSERT_ROW, {"key": key, "i": i})
        params = {"key": key, "token": row[0], "result": json.dumps(result)}
        if conn.execute(COMPLETE, params).rowcount != 1:
            raise Refused(f"{key}: token {row[0]} was superseded")
        conn.commit()
    except BaseException:  # the row goes with the refused completion
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        if not conn.closed:
            conn.autocommit = True
    return result
