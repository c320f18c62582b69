"""Where a fenced commit's server CPU goes: ``python -m benchmarks.statement_cpu [--runs N]``.

In this process, on one psycopg connection (a ``ClientCursor``; the store sends the same text through
libpq), runs the statements of a commit-mode run as the store sends them (``BEGIN; <read>``, the task's
``INSERT``, ``<claim>; COMMIT``) and, beside them, the same with one part taken out each (the read's
``set_config``, the claim's ``fence_unchanged()``, its advisory lock, its history row), the same as
server-side prepared statements (``EXECUTE``), and an unfenced ``BEGIN``, ``INSERT``, ``COMMIT``. Variants
alternate, 5 rounds of N runs each; prints the median CPU µs per run of the connection's PostgreSQL backend
(from ``/proc``) and of this process. The parts taken out are for measuring only: the store never runs
without them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from celery_fence.stores.sql.one_trip import OneTrip

from .services import pg_schema
from .stores import _migrated

ROW = "INSERT INTO fence_bench_rows (key, i) VALUES (%(key)s, %(i)s)"


def _backend_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _without(text: str, pattern: str, replacement: str = "") -> str:
    changed = re.sub(pattern, replacement, text, flags=re.S)
    assert changed != text, pattern  # the part is still there to take out
    return changed


def _variants(opening: OneTrip, claiming: OneTrip, cur: Any) -> dict[str, Callable[[], None]]:
    read, claim = opening.text, claiming.text

    def fenced(read_sql: str, claim_sql: str) -> Callable[[], None]:
        def run() -> None:
            key = str(uuid.uuid4())
            record = json.dumps({"task": "bench.x", "id": key, "args": [1], "kwargs": {}})
            cur.execute(f"BEGIN; {read_sql}", {"key": key, "idle_ms": 30000})
            cur.nextset()
            cur.fetchall()
            cur.execute(ROW, {"key": key, "i": 1})
            params = {"key": key, "owner": "w@h:1", "result": '{"i": 1}', "run": record, "task_id": key}
            cur.execute(f"{claim_sql}; COMMIT", params)
            cur.fetchall()

        return run

    def unfenced() -> None:
        cur.execute("BEGIN")
        cur.execute(ROW, {"key": str(uuid.uuid4()), "i": 1})
        cur.execute("COMMIT")

    lock = r"\(SELECT nextval\('fence_token_seq'\) FROM pg_advisory_xact_lock_shared\([^)]*\)\)\)"
    return {
        "unfenced write": unfenced,
        "commit mode, simple queries": fenced(read, claim),
        "  without the read's set_config": fenced(
            _without(read, r", set_config\('idle_in_transaction_session_timeout'.*?true\)"), claim
        ),
        "  without fence_unchanged()": fenced(
            read, _without(claim, r"\s*UNION ALL SELECT fence_unchanged.*$")
        ),
        "  without the advisory lock": fenced(read, _without(claim, lock, "nextval('fence_token_seq')")),
        "  without the history row": fenced(
            read, _without(claim, r",\s*logged AS \(INSERT INTO fence_history.*?FROM changed\)")
        ),
        "commit mode, prepared (EXECUTE)": fenced(*_prepared(cur, opening, claiming)),
    }


def _prepared(cur: Any, *statements: OneTrip) -> list[str]:
    """Each statement prepared on ``cur``'s connection, as the store prepares it; the ``EXECUTE`` of it."""
    for statement in statements:
        cur.execute(f"PREPARE {statement.tag} AS {statement.prepared_text}")
    return [f"EXECUTE {s.tag}({', '.join(f'%({n})s' for n in s.names)})" for s in statements]


def main(argv: list[str]) -> int:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    from celery_fence.stores.sql.queries import queries_for

    parser = argparse.ArgumentParser(prog="python -m benchmarks.statement_cpu")
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args(argv)
    queries, dialect = queries_for("postgresql"), PGDialect_psycopg()
    read = OneTrip.of("open_read", queries.open_read, dialect)
    claim = OneTrip.of("claim", queries.claim, dialect)
    with pg_schema("stmt") as schema:
        _migrated(schema.url)
        with psycopg.connect(schema.dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            conn.execute("CREATE TABLE fence_bench_rows (key text, i int)")
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            variants = _variants(read, claim, conn.cursor())
            spent: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            for _ in range(5):
                for name, run in variants.items():
                    server, client = _backend_cpu(backend), time.process_time()
                    for _ in range(args.runs):
                        run()
                    server, client = _backend_cpu(backend) - server, time.process_time() - client
                    spent[name].append((server / args.runs * 1e6, client / args.runs * 1e6))
    print(f"CPU µs per run, median of 5 rounds of {args.runs} (server: the connection's backend):")
    for name, figures in spent.items():
        server = statistics.median(f[0] for f in figures)
        client = statistics.median(f[1] for f in figures)
        print(f"  {name:36s} server {server:5.0f}  client {client:5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
