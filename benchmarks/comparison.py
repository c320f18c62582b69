"""celery-fence and its peers on the same faults, counting effect rows (``make compare``).

Run it with ``.venv-compare/bin/python -m benchmarks.comparison`` (``make compare`` makes that venv with the
``compare`` extra, so the project's ``.venv`` is never touched). Needs PostgreSQL on 127.0.0.1:5432 (trust,
user postgres; the script creates the database ``celery_fence_compare``) and Redis on 127.0.0.1:6379 (DBs
5, 6 and 8, flushed at the start: 5 broker and results, 6 the locks of celery-once, celery-singleton and
fencekit, 8 relier's broker and keys).

Per library, two real ``celery worker`` processes (prefork, ``-c 1``, acks_late, reject_on_worker_lost)
share one queue, and one logical job (same arguments) goes through each scenario:

- **stall**: the run is SIGSTOPped once it has started (the pid comes from its mark file), left stopped
  ``expiry + 1`` seconds, the producer sends the same job again (the library's own ``apply_async``/``push``),
  the copy runs on the other worker; once it has ended the first run gets SIGCONT and tries its write.
- **kill before write** / **kill after write**: the pool process is SIGKILLed once it has started (or once
  its effect row is in); the broker redelivers the message (reject_on_worker_lost) and the job runs again.

The count is the job's rows in ``compare_effects``; one row is the right answer. "completed" means at least
one run's effect committed. Waits are polls with deadlines; the stall itself is the one timed pause.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis

from celery_fence.testing import Worker
from celery_fence.testing import wait_for as kit_wait_for

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
LIBS = ("celery-fence", "celery-once", "celery-singleton", "fencekit", "relier")
DISTS = {"celery-fence": "celery-fence", "celery-once": "celery_once", "celery-singleton": "celery-singleton",
         "fencekit": "fencekit", "relier": "relier"}  # fmt: skip
SCENARIOS = ("stall", "kill-before-write", "kill-after-write")
EXPIRY = 3.0
REDIS = "redis://127.0.0.1:6379"
PG_DB = "celery_fence_compare"
DOC = ROOT / "docs" / "comparison.md"
RESULTS = ROOT / "benchmarks" / "comparison_results.json"
BEGIN, END = "<!-- comparison:begin -->", "<!-- comparison:end -->"
# A folder holding a celery_fence/ to run instead of the working tree's (e.g. `git archive HEAD celery_fence`
# unpacked there, when the tree is being edited while the comparison runs): the processes start in it.
FENCE_SRC = os.environ.get("CMP_FENCE_SRC")
CWD = Path(FENCE_SRC) if FENCE_SRC else ROOT


def wait_for(condition: Callable[[], T], timeout: float, what: str = "") -> T | None:
    """The fault kit's ``wait_for``, but ``None`` after ``timeout``: a peer that never gets there is a
    finding of the comparison, not an error."""
    try:
        return kit_wait_for(condition, timeout, what or "the condition")
    except AssertionError:
        return None


class Run:
    """The environment of one library: its workers' env, its marks folder, its sender."""

    def __init__(self, lib: str, workdir: Path) -> None:
        self.lib, self.workdir = lib, workdir
        self.env = {
            **os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(CWD), str(ROOT)])),
            "CMP_LIB": lib, "CMP_REDIS": REDIS, "CMP_PG_DB": PG_DB,
            "CMP_EXPIRY": str(EXPIRY), "CMP_DIR": str(workdir),
            # relier: its own Redis DB; an in-flight lock as short as the others' expiry (its settings
            # insist on hard_timeout < inflight ttl, so the global timeouts come down with it)
            "RELIER_REDIS_URL": f"{REDIS}/8", "RELIER_IDEMPOTENCY_INFLIGHT_TTL": str(int(EXPIRY)),
            "RELIER_HARD_TIMEOUT": "2", "RELIER_SOFT_TIMEOUT": "1", "RELIER_OTEL_ENABLED": "false",
        }  # fmt: skip
        self.queue = "default" if lib == "relier" else f"cmp.{lib}"
        self.workers: list[Worker] = []

    def send(self, job: str) -> str:
        cmd = [sys.executable, "-m", "benchmarks.comparison_app", "send", job]
        done = subprocess.run(
            cmd, check=False, env=self.env, cwd=CWD, capture_output=True, text=True, timeout=60
        )
        if done.returncode:
            raise RuntimeError(f"{self.lib}: send failed:\n{done.stderr[-3000:]}")
        return done.stdout.strip().splitlines()[-1]

    def pids(self, job: str, what: str) -> list[int]:
        return [int(p.name.split(".")[-2]) for p in self.workdir.glob(f"{job}.*.{what}")]

    def marks_count(self, job: str) -> int:
        return len(list(self.workdir.glob(f"{job}.*")))


def start_worker(run: Run, name: str) -> Worker:
    """One of a library's two workers: the fault kit's, prefork, one process."""
    worker = Worker(
        "benchmarks.comparison_app", f"cmp-{run.lib}-{name}", run.workdir, queues=run.queue,
        env=run.env, cwd=CWD,
    )  # fmt: skip
    try:
        return worker.start(90)
    except AssertionError as exc:
        worker.stop()
        raise RuntimeError(f"worker {name} of {run.lib} did not start:\n{worker.log_text()[-3000:]}") from exc


def connect(db: str = PG_DB) -> psycopg.Connection[Any]:
    """A connection, retried for a while: other test runs on this machine can use up max_connections."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{db}", autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def rows(lib: str, job: str) -> int:
    with connect() as conn:
        query = "SELECT count(*) FROM compare_effects WHERE lib = %s AND job = %s"
        return int(conn.execute(query, (lib, job)).fetchone()[0])


def quiet(run: Run, job: str, seconds: float = 3.0, bound: float = 30.0) -> None:
    """Wait until no mark of ``job`` has appeared for ``seconds`` (a late copy would show up here)."""
    seen, since, deadline = run.marks_count(job), time.monotonic(), time.monotonic() + bound
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(0.1)
        now = run.marks_count(job)
        if now != seen:
            seen, since = now, time.monotonic()


def stall(run: Run) -> dict[str, Any]:
    job = f"stall-{uuid.uuid4().hex[:8]}"
    sent = [run.send(job)]
    first = wait_for(lambda: run.pids(job, "started"), 30, "the first run")
    if not first:
        return {"job": job, "sent": sent, "note": "the first run never started"}
    pid = first[0]
    os.kill(pid, signal.SIGSTOP)
    time.sleep(EXPIRY + 1.0)  # the fault itself: stopped past the lock's expiry
    sent.append(run.send(job))
    copy = wait_for(lambda: [p for p in run.pids(job, "ended") if p != pid], 30, "the copy to end")
    os.kill(pid, signal.SIGCONT)
    resumed = wait_for(lambda: pid in run.pids(job, "ended"), 30, "the resumed run to end")
    quiet(run, job)
    notes = [] if copy else ["the copy never ran its body"]
    notes += [] if resumed else ["the resumed run did not end"]
    return {"job": job, "sent": sent, "copy_ran": bool(copy), "rows": rows(run.lib, job), "notes": notes}


def kill(run: Run, at: str) -> dict[str, Any]:
    job = f"kill-{at}-{uuid.uuid4().hex[:8]}"
    sent = [run.send(job)]
    victim = wait_for(lambda: run.pids(job, at), 30, f"the run to reach {at}")
    if not victim:
        return {"job": job, "sent": sent, "note": f"the run never reached {at}"}
    os.kill(victim[0], signal.SIGKILL)
    again = wait_for(lambda: [p for p in run.pids(job, "ended") if p != victim[0]], 40, "the redelivered run")
    quiet(run, job)
    notes = [] if again else ["no later run ended within 40 s"]
    return {"job": job, "sent": sent, "rows": rows(run.lib, job), "notes": notes}


def prepare() -> None:
    with connect("postgres") as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DB,)).fetchone():
            conn.execute(f'CREATE DATABASE "{PG_DB}"')
    with connect() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS compare_effects (id bigserial PRIMARY KEY, lib text NOT NULL, "
            "job text NOT NULL, pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    for db in (5, 6, 8):  # this script's own Redis DBs: no message or lock of an earlier run survives
        redis.Redis.from_url(f"{REDIS}/{db}").flushdb()


def run_library(lib: str, workdir: Path) -> dict[str, Any]:
    run = Run(lib, workdir)
    out: dict[str, Any] = {"lib": lib, "version": metadata.version(DISTS[lib])}
    try:
        run.workers = [start_worker(run, "a"), start_worker(run, "b")]
        out["stall"] = stall(run)
        out["kill-before-write"] = kill(run, "started")
        out["kill-after-write"] = kill(run, "wrote")
    except Exception as exc:  # a peer that cannot run at all is reported, not hidden
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        for worker in run.workers:
            worker.stop()
    return out


def cell(result: dict[str, Any], scenario: str) -> str:
    found = result.get(scenario)
    if not found or "rows" not in found:
        return "did not run" if "error" in result else (found or {}).get("note", "n/a")
    n = found["rows"]
    return f"{n} row{'s' if n != 1 else ''}" + ("" if n else " (job not completed)")


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| library | version | stall past expiry + copy | kill before write | kill after write |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        lines.append(f"| {r['lib']} | {r['version']} | " + " | ".join(cell(r, s) for s in SCENARIOS) + " |")
    return "\n".join(lines)


def report(results: list[dict[str, Any]]) -> str:
    versions = ", ".join(f"{d} {metadata.version(d)}" for d in ("celery", "kombu", "redis"))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rev = os.environ.get("CMP_FENCE_REV") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    source = f"an export of commit {rev}" if FENCE_SRC else f"the working tree at {rev}"
    head = (f"Measured {when} by `make compare` ({versions}, Python {sys.version.split()[0]}; celery-fence "
            f"from {source}; lock expiry {EXPIRY:g} s for every library). One row is the right answer "
            "in every column.")  # fmt: skip
    details = []
    for r in results:
        if "error" in r:
            details.append(f"- {r['lib']}: could not run: `{r['error'].splitlines()[0]}`")
            continue
        for s in SCENARIOS:
            found = r.get(s, {})
            sent = "; ".join(found.get("sent", []))
            notes = "; ".join(found.get("notes", []))
            details.append(f"- {r['lib']}, {s}: sends: {sent}" + (f"; {notes}" if notes else ""))
    return "\n".join([head, "", table(results), "", "<details><summary>What each send did</summary>", "",
                      *details, "", "</details>"])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=LIBS, help="run these libraries only")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/comparison.md as it is")
    args = parser.parse_args()
    prepare()
    results = []
    tmp = Path(tempfile.mkdtemp(prefix="fence-compare-"))  # kept: the workers' logs and the marks
    for lib in args.only or LIBS:
        print(f"{lib} ... (logs in {tmp})", flush=True)
        results.append(run_library(lib, tmp))
        print(f"  {json.dumps(results[-1])}", flush=True)
    text = report(results)
    print(text)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    if not args.no_doc and not args.only and DOC.exists() and BEGIN in DOC.read_text():
        doc = DOC.read_text()
        before, rest = doc.split(BEGIN, 1)
        DOC.write_text(f"{before}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")
    fence = next((r for r in results if r["lib"] == "celery-fence"), None)
    if fence and any(fence.get(s, {}).get("rows") != 1 for s in SCENARIOS):
        print("celery-fence did not leave exactly one row in every scenario: a bug", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
