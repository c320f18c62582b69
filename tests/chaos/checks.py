"""What every chaos case ends with: every key done (nothing lost), one ledger row and one completion (a
lease's ``complete`` or a fenced commit's ``commit``) per key, ``verify`` clean; and the tally the soak
report is made of."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import inspect, text

from celery_fence import FenceError
from celery_fence.verify import verify_store
from tests.integration.workers import wait_for
from tests.integration.world import Cluster, effects_engine

RUNS = int(os.environ.get("FENCE_SOAK_RUNS", "4"))  # faulted runs per fault and store; `make soak`: 1000
REPORT = os.environ.get("FENCE_SOAK_REPORT")  # a JSON-lines file the soak table is made from


@dataclass
class Tally:
    store: str
    fault: str
    runs: int
    takeovers: int
    refused: int
    duplicates_absorbed: int
    lost: int
    violations: int


def done(cluster: Cluster, key: str) -> bool:
    try:
        state = cluster.store.get(key)
    except FenceError:  # the fault may be cutting the store right now
        return False
    return state is not None and state.done


def settle_and_check(
    cluster: Cluster, store: str, fault: str, keys: list[str], timeout: float = 120,
    table: str = "fence_it_ledger",
) -> Tally:
    """Every key done, with one row in ``table`` and one completion (``complete``, or a fenced commit's
    ``commit``); ``verify`` clean."""
    wait_for(lambda: all(done(cluster, key) for key in keys), timeout, f"{len(keys)} keys to finish")
    engines = {id(e): e for e in (effects_engine(cluster.store, cluster.user_db), cluster.user_db)}
    rows: Counter[str] = Counter()
    for engine in engines.values():
        engine.dispose()  # this test's own pooled connections: the fault may have ended them
        if not inspect(engine).has_table(table):  # fence_it_effects: only where the fenced writes go
            continue
        with engine.connect() as conn:
            rows.update(r.key for r in conn.execute(text(f"SELECT key FROM {table}")))
    history = cluster.store.history()
    events = Counter((e.key, e.event) for e in history)
    violations = verify_store(cluster.store)
    tally = Tally(
        store,
        fault,
        len(keys),
        takeovers=sum(n for (k, event), n in events.items() if event == "takeover" and k in keys),
        refused=sum(n for (k, event), n in events.items() if event == "refused" and k in keys),
        duplicates_absorbed=sum(w.log_text().count("absorbed:") for w in cluster.workers),
        lost=sum(1 for key in keys if not done(cluster, key)),
        violations=len(violations),
    )
    if REPORT:
        with Path(REPORT).open("a") as out:
            out.write(json.dumps(asdict(tally)) + "\n")
    print(f"\n{tally}")
    assert violations == [], violations
    assert {key: rows[key] for key in keys} == dict.fromkeys(keys, 1), "a ledger row missing or doubled"
    completions = {key: events[(key, "complete")] + events[(key, "commit")] for key in keys}
    assert completions == dict.fromkeys(keys, 1), f"a key completed twice or never: {completions}"
    return tally
