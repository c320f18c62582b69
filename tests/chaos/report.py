"""``python -m tests.chaos.report SOAK.jsonl docs/reliability.md [SECTION]``: the soak table from the chaos
tallies, written between ``<!-- soak:begin -->`` and ``<!-- soak:end -->`` (or, given a SECTION, between
``<!-- soak-SECTION:begin -->`` and its end marker, so a soak of a few cases leaves the full table alone)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections import defaultdict
from datetime import date
from pathlib import Path

COLUMNS = ("runs", "takeovers", "refused", "duplicates_absorbed", "lost", "violations")
# A failover's own counts (PostgreSQL, Redis Cluster), and the messages a worker killed under load took
# with it (test_worker_killed_under_load): columns only when one of the tallies has them.
EXTRA = ("tokens_lost", "reissued", "completions_lost", "ran_again", "forgotten", "rewound", "redone",
         "tokens_reused", "ledger_wrong", "no_result", "never_ran", "in_unacked", "vanished")  # fmt: skip
HEADER = """# Reliability: the fault soak

Every row is one fault on one lease store, on real `celery worker` processes (prefork, Redis broker,
`acks_late`, `task_reject_on_worker_lost`), produced by `make soak` (the chaos suite with
`FENCE_SOAK_RUNS` faulted runs per fault and store; CI runs the same suite with 4). Each case ends with
the same checks: every key finished (no task lost), exactly one ledger row and one completion per key,
and `celery fence verify` clean. `refused` counts stale writes the store rejected; `duplicates absorbed`
counts deliveries answered without running the body (already done, or held by a copy of the same id).
The SIGKILL rows count no takeover because the worker's main process sees its pool process die and
releases that lease at once (`FencedRequest`): the next run acquires it without waiting for the ttl.
"""


def main(source: str, target: str, section: str = "") -> None:
    tallies = [json.loads(line) for line in Path(source).read_text().splitlines()]
    columns = COLUMNS + tuple(c for c in EXTRA if any(c in tally for tally in tallies))
    rows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(columns, 0))
    for tally in tallies:
        row = rows[(tally["store"], tally["fault"])]
        for column in columns:
            row[column] += tally.get(column, 0)
    runs = {row["runs"] for row in rows.values()}
    lines = [f"Run on {date.today()} at commit {_commit()}, {platform.node()} ({platform.machine()}, Python "
             f"{platform.python_version()}), {min(runs)}-{max(runs)} faulted runs per row, "
             f"{os.environ.get('FENCE_SOAK_BATCH', '4')} at once.\n",
             "| store | fault | " + " | ".join(c.replace("_", " ") for c in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for (store, fault), row in sorted(rows.items()):
        lines.append(f"| {store} | {fault} | " + " | ".join(str(row[c]) for c in columns) + " |")
    totals = {c: sum(row[c] for row in rows.values()) for c in columns}
    lines.append("| **all** | | " + " | ".join(f"**{totals[c]}**" for c in columns) + " |")
    _write_between_markers(Path(target), "\n".join(lines), f"soak-{section}" if section else "soak")
    print("\n".join(lines[-len(rows) - 3 :]))


def _write_between_markers(target: Path, table: str, name: str) -> None:
    """Replace what stands between the markers; anything written around them by hand stays."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = target.read_text() if target.exists() else ""
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1]
    elif text:
        before, after = text.rstrip("\n") + "\n\n", "\n"
    else:
        before, after = HEADER + "\n", "\n"
    target.write_text(f"{before}{begin}\n{table}\n{end}{after}")


def _commit() -> str:
    args = ["git", "rev-parse", "--short", "HEAD"]
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    main(*sys.argv[1:4])
