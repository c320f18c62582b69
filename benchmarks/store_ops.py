"""Store operations: celery-fence acquire+complete cycles/s vs the same two statements issued directly with
psycopg, at 1, 4 and 16 connections (one process per connection: Celery's prefork model, and no GIL
between the connections), PostgreSQL.

The direct side runs the library's own SQL in autocommit, one connection per process, encoding the result
with ``json.dumps`` as the library does: the two statements the store hands psycopg for one acquire and one
complete, recorded once (the text, in psycopg's ``%(name)s`` format). The library
side calls ``store.acquire`` / ``store.complete`` on one store (``open_store``) per process. Both write the
same tables with the same trigger. Each measurement runs a fixed time; library and direct alternate within
each round.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import re
import time
import uuid
from functools import partial
from typing import Any

from celery_fence import open_store

from .services import pg_schema
from .stats import ratios, summary
from .stores import lease_store, opened

CONNECTIONS = (1, 4, 16)
WARMUP = 30


ACQUIRE_PARAMS, COMPLETE_PARAMS = {"key", "owner", "ttl", "run"}, {"key", "token", "result"}


def store_sql(url: str) -> tuple[str, str]:
    """The acquire and complete statements the store at ``url`` sends through psycopg, recorded during one
    ``store.acquire`` + ``store.complete`` (public calls only); checked to name no parameter that the direct
    side does not pass."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def recording(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, params, **kwargs)

    psycopg.Cursor.execute = recording  # type: ignore[method-assign]
    try:
        with opened(url) as store:
            store.complete(store.acquire(f"sql-{uuid.uuid4().hex[:8]}", "bench-owner", 30.0), {})
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    acquire, complete = sent[-2:]  # the schema check, if any, comes first
    needs = (set(re.findall(r"%\((\w+)\)s", acquire)), set(re.findall(r"%\((\w+)\)s", complete)))
    if not (needs[0] <= ACQUIRE_PARAMS and needs[1] <= COMPLETE_PARAMS):
        raise RuntimeError(f"the store's statements take {needs}: update the direct side's parameters")
    return acquire, complete


def _library(url: str, prefix: str, seconds: float, barrier: Any, out: Any) -> None:
    store = open_store(url)

    def cycle(key: str) -> None:
        store.complete(store.acquire(key, "bench-owner", 30.0), {"key": key})

    out.put(_timed(cycle, prefix, seconds, barrier))
    store.close()


def _direct(dsn: str, sql: tuple[str, str], prefix: str, seconds: float, barrier: Any, out: Any) -> None:
    import psycopg

    acquire, complete = sql
    conns = [psycopg.connect(dsn, autocommit=True)]

    def cycle(key: str) -> None:
        if conns[0].closed:
            conns[0] = psycopg.connect(dsn, autocommit=True)
        conn = conns[0]
        row = conn.execute(acquire, {"key": key, "owner": "bench-owner", "ttl": 30.0, "run": None}).fetchone()
        assert row is not None
        params = {"key": key, "token": row[0], "result": json.dumps({"key": key}, separators=(",", ":"))}
        assert conn.execute(complete, params).fetchone() is not None

    out.put(_timed(cycle, prefix, seconds, barrier))
    conns[0].close()


def _timed(cycle: Any, prefix: str, seconds: float, barrier: Any) -> tuple[int, int]:
    """Cycles done in ``seconds`` after the barrier, and cycles that failed (a connection killed from
    outside: the machine is shared)."""
    for i in range(WARMUP):
        with contextlib.suppress(Exception):  # a connection killed from outside: the next cycle reconnects
            cycle(f"{prefix}:w{i}")
    barrier.wait()
    deadline, done, failed = time.perf_counter() + seconds, 0, 0
    while time.perf_counter() < deadline:
        try:
            cycle(f"{prefix}:{done}:{failed}")
            done += 1
        except Exception:
            failed += 1
    return done, failed


def _measure(side: str, url: str, dsn: str, connections: int, seconds: float) -> tuple[float, int]:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(connections + 1), ctx.Queue()
    run = uuid.uuid4().hex[:8]
    target = partial(_library, url) if side == "library" else partial(_direct, dsn, store_sql(url))
    procs = [
        ctx.Process(target=target, args=(f"{side}:{run}:{p}", seconds, barrier, out))
        for p in range(connections)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    counts = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    return sum(c[0] for c in counts) / seconds, sum(c[1] for c in counts)


def _undisturbed(side: str, url: str, dsn: str, connections: int, seconds: float, log: Any) -> float:
    """A measurement without failed cycles (tried again up to twice)."""
    for attempt in range(3):
        rate, failed = _measure(side, url, dsn, connections, seconds)
        if not failed:
            return rate
        log(f"  ({failed} {side} cycles failed: a connection was killed from outside; attempt {attempt + 2})")
    return rate


def run(rounds: int, seconds: float, log: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {"rounds": rounds, "seconds_per_measurement": seconds}}
    with pg_schema("ops") as schema, lease_store("postgresql", schema) as leases:
        url = leases.url
        for n in CONNECTIONS:
            lib: list[float] = []
            direct: list[float] = []
            for r in range(rounds):
                sides = ("library", "direct") if r % 2 == 0 else ("direct", "library")
                for side in sides:
                    (lib if side == "library" else direct).append(
                        _undisturbed(side, url, schema.dsn, n, seconds, log)
                    )
            log(
                f"  {n} connection(s): library {[round(x) for x in lib]}, direct {[round(x) for x in direct]}"
            )
            out[str(n)] = {
                "library_cycles_per_s": summary(lib, 1),
                "direct_cycles_per_s": summary(direct, 1),
                "ratio": summary(ratios(lib, direct)),
            }
    return out
