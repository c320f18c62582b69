"""PostgreSQL failover on real workers: the primary SIGKILLed mid-run (its whole
process group) and its streaming standby promoted, the store on a libpq multi-host URL
(``target_session_attrs=read-write``) finding the new primary by itself.

Synchronous standby: every commit the old primary acknowledged is on the new one, so the usual checks hold
(nothing lost, no violation). Asynchronous standby: the test makes the standby lag (the fault kit's proxy
on its replication link cut) while runs complete (a third acquired before the lag, a third during it) and
start (a third, running at the kill), then fails over, and counts what went wrong instead of hiding it:
completions the old primary acknowledged that the new one lacks, keys run again, tokens issued a second
time, keys never finished, ledger rows missing or doubled; once as it happens, once with the remedy of
docs/operating.md (the new primary kept read-only for clients until ``celery fence advance`` has run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from celery_fence.verify import verify_store
from tests.integration.workers import wait_for
from tests.integration.world import Cluster

from .checks import REPORT, RUNS, done, settle_and_check
from .report import COLUMNS
from .sending import all_started, batches, every_store, send

pytestmark = pytest.mark.chaos
RECOVER = ("--fence-recover", "--fence-recover-interval", "1")
FILLER = 40  # other keys' acquires during the lag: more than the 32 values a sequence logs ahead
CELERY = Path(sys.executable).with_name("celery")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cluster", every_store("postgresql-sync-standby", restartable="1"), indirect=True)
def test_the_primary_killed_and_a_synchronous_standby_promoted(cluster: Cluster) -> None:
    cluster.worker("a", concurrency=max(batches(RUNS)), extra=RECOVER)
    keys: list[str] = []
    issued: list[tuple[str, int, str]] = []
    for size in batches(RUNS):
        ids = send(cluster.queue, size, pause=2.0)
        wait_for(lambda ids=ids: all_started(cluster, ids), 60, "the runs to start")
        issued += _history(cluster.server.primary.port)
        with cluster.server.failing_over():
            wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 120, "the runs to finish")
        keys += ids
    store, fault = "postgresql-sync-standby", "primary SIGKILLed, standby promoted"
    settle_and_check(cluster, store, fault, keys)  # writes the usual columns
    counts = _what_went_wrong(cluster, issued, keys)
    print(f"{counts} over {cluster.server.failovers} failovers")
    _report({"store": store, "fault": fault, **dict.fromkeys(COLUMNS, 0)}, counts)
    assert counts == Counts(), "a synchronous failover lost an acknowledged commit or reused a token"


# The rewind as it happens is shown in `make test` by tests/stores/sql/test_pg_primary_and_standby.py; here,
# soak only.
@pytest.mark.parametrize(
    "remedy", [pytest.param(False, marks=pytest.mark.soak), True], ids=["as-is", "advance-after-promotion"]
)
@pytest.mark.parametrize("cluster", every_store("postgresql-async-standby", restartable="1"), indirect=True)
def test_the_primary_killed_and_a_lagging_asynchronous_standby_promoted(
    cluster: Cluster, remedy: bool
) -> None:
    pair = cluster.server
    cluster.worker("a", concurrency=2 * max(batches(RUNS)), extra=RECOVER)
    keys: list[str] = []
    healed: list[str] = []  # the keys that must finish again on the new primary
    issued: list[tuple[str, int, str]] = []
    for size in batches(RUNS):
        third = size // 3
        held = send(cluster.queue, size - 2 * third, pause=2.0)  # acquired before the lag, done during it
        wait_for(lambda ids=held: all_started(cluster, ids), 60, "the runs to start")
        pair.wait_replayed()
        pair.stop_replication()
        wait_for(lambda ids=held: all(done(cluster, i) for i in ids), 60, "completions on the old primary")
        started = send(cluster.queue, third, pause=60.0, hold=True)  # acquired in the lag, running at kill
        wait_for(lambda ids=started: all_started(cluster, ids), 60, "the runs to start")
        quick = send(cluster.queue, third, pause=0.0)  # acquired and completed during the lag
        wait_for(lambda ids=quick: all(done(cluster, i) for i in ids), 60, "completions on the old primary")
        for n in range(FILLER):  # a busy store: other keys take tokens too
            cluster.store.acquire(f"filler-{pair.failovers}-{n}", "filler", 60)
        issued += _history(pair.primary.port)
        with pair.failing_over(gated=remedy):
            if remedy:
                _advance(cluster, pair.primary.port)
        for key in started:  # their bodies end now, on the new primary's watch
            (cluster.workdir / f"{key}.release").touch()
        keys += held + started + quick
        healed += held + started
        _finish(cluster, started, strict=remedy, timeout=30)
    # The held runs' completions are gone with the lag: recovery runs them again once their leases expire.
    # The quick runs left no trace on the new primary and their messages are acked: nothing runs them again.
    _finish(cluster, healed, strict=remedy)
    counts = _what_went_wrong(cluster, issued, keys)
    violations = verify_store(cluster.store)
    fault = "lagging standby promoted" + (", then advance" if remedy else "")
    tally = {"store": "postgresql-async-standby", "fault": fault, "runs": len(keys), **_events(cluster, keys),
             "lost": sum(not done(cluster, k) for k in keys), "violations": len(violations)}  # fmt: skip
    print(f"\n{tally} {counts} over {pair.failovers} failovers; verify: {violations}")
    for key in healed:  # a key the library should have finished again: what the store says of it
        if not done(cluster, key):
            print(f"unfinished {key}: {cluster.store.get(key)} {cluster.events(key)}")
            for worker in cluster.workers:
                print("\n".join(line for line in worker.log_text().splitlines() if key[:8] in line))
    _report(tally, counts)
    assert counts.completions_lost > 0, "no acknowledged completion was lost: the lag did not bite"
    if remedy:
        assert counts.tokens_reused == 0, "advance after promotion left a token issued twice"
    else:
        assert counts.tokens_reused > 0, "no token was issued twice: the rewind did not happen"


def _finish(cluster: Cluster, keys: list[str], strict: bool, timeout: float = 120) -> None:
    """Wait for ``keys`` to finish; without the remedy, a key that does not (two attempts of a key given
    the same token cannot be told apart) is counted as lost, not waited for past the deadline."""
    if strict:
        wait_for(lambda: all(done(cluster, k) for k in keys), timeout, f"{len(keys)} keys to finish")
        return
    deadline = time.monotonic() + timeout
    while not all(done(cluster, k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.2)


@dataclass(frozen=True)
class Counts:
    """What a failover did that docs/guarantees.md#the-guarantees forbids (all 0 on a synchronous standby)."""

    completions_lost: int = 0  # a completion the old primary acknowledged, absent on the new one
    redone: int = 0  # of those, keys that ran again (recovery) and finished with another token
    tokens_reused: int = 0  # a token the new primary issued to another acquisition than the old one did
    ledger_wrong: int = 0  # keys whose ledger row (written in the run's transaction) is missing or doubled


def _history(port: int) -> list[tuple[str, int, str]]:
    """Every acquisition and completion the old primary has, read on it just before it dies."""
    query = "SELECT key, token, event FROM fence_history WHERE event IN ('acquire', 'takeover', 'complete')"
    return [(k, int(t), e) for k, t, e in _sql(port, query)]


def _sql(port: int, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        return conn.execute(query, args or None).fetchall()


def _what_went_wrong(cluster: Cluster, issued: list[tuple[str, int, str]], keys: list[str]) -> Counts:
    final = [(e.key, e.token, e.event) for e in cluster.store.history()]
    completed = {(k, t) for k, t, e in final if e == "complete"}
    acked = {(k, t) for k, t, e in issued if e == "complete" and k in keys}
    lost = acked - completed
    holders: dict[int, set[str]] = {}  # every primary's acquisitions: a token given to two keys is reused
    for k, t, e in issued + final:
        if e != "complete":
            holders.setdefault(t, set()).add(k)
    reused = {t for t, ks in holders.items() if len(ks) > 1}
    redone = {k for k, _ in lost if any(key == k for key, _ in completed)}
    cluster.store.engine.dispose()  # its pooled connections were on the dead primaries
    with cluster.store.engine.connect() as conn:
        rows = Counter(r.key for r in conn.execute(text("SELECT key FROM fence_it_ledger")))
    return Counts(len(lost), len(redone), len(reused), sum(rows[k] != 1 for k in keys))


def _advance(cluster: Cluster, port: int) -> None:
    """docs/operating.md's step: ``celery fence advance`` on the new primary alone, in a session that
    lifts its read-only default (the workers' URL still finds no read-write server)."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres?options=-cdefault_transaction_read_only%3Doff"
    env = {**os.environ, **cluster.env, "FENCE_IT_STORE": url, "PYTHONPATH": str(ROOT)}
    command = [str(CELERY), "-A", "tests.integration.fenced_app", "fence", "advance"]
    done_ = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done_.returncode == 0, done_.stderr
    assert "token counter advanced by 1000000" in done_.stdout, done_.stdout


def _events(cluster: Cluster, keys: list[str]) -> dict[str, int]:
    events = Counter((e.key, e.event) for e in cluster.store.history())
    return {
        "takeovers": sum(n for (k, e), n in events.items() if e == "takeover" and k in keys),
        "refused": sum(n for (k, e), n in events.items() if e == "refused" and k in keys),
        "duplicates_absorbed": sum(w.log_text().count("absorbed:") for w in cluster.workers),
    }


def _report(tally: dict[str, Any], counts: Counts) -> None:
    """The soak's line for this case, with the failover's own counts beside the usual columns."""
    if REPORT:
        row = {**tally, **asdict(counts)}
        with Path(REPORT).open("a") as out:
            out.write(json.dumps(row) + "\n")
