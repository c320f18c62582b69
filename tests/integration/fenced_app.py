"""The Celery app the integration tests run in real ``celery worker`` processes (configured by env)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import after_task_publish, before_task_publish
from kombu import Exchange, Queue
from sqlalchemy import BigInteger, Column, Engine, Integer, MetaData, Table, Text, create_engine, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError

from celery_fence import FencedTask, StaleToken, fenced_update
from celery_fence.stores.base import FencedConnectionStore

env = os.environ.get
app = Celery("fenced_app", broker=env("FENCE_IT_BROKER", "memory://"), backend=env("FENCE_IT_BACKEND"))
app.conf.update(
    fence_store_url=env("FENCE_IT_STORE", "memory://"),
    fence_lease_ttl=float(env("FENCE_IT_TTL", "2")),
    fence_renew_interval=float(env("FENCE_IT_INTERVAL")) if env("FENCE_IT_INTERVAL") else None,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={  # restore sweeps every second, so a short visibility_timeout shows
        "visibility_timeout": float(env("FENCE_IT_VISIBILITY", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
if env("FENCE_IT_ROUTE"):  # "queue,exchange,routing key": a queue whose routing key is not its name
    _queue, _exchange, _key = env("FENCE_IT_ROUTE", "").split(",")
    app.conf.task_queues = [Queue(_queue, Exchange(_exchange, type="direct"), routing_key=_key)]
MARKS = Path(env("FENCE_IT_DIR", "/tmp"))
INSERT = text("INSERT INTO fence_it_effects (key, token, task_id, pid) VALUES (:k, :t, :id, :pid)")
# With a Redis or etcd lease store, the effect lands on a PostgreSQL table guarded by fenced_update.
accounts = Table(
    "fence_it_accounts",
    MetaData(),
    Column("key", Text, primary_key=True),
    Column("writes", Integer, nullable=False, default=0),
    Column("token", BigInteger),
    Column("task_id", Text),
    Column("pid", Integer),
    Column("fence_token", BigInteger),
)
_engines: dict[str, Engine] = {}


def user_db() -> Engine:
    url = env("FENCE_IT_USER_DB", "")
    if url not in _engines:
        _engines[url] = create_engine(url)
    return _engines[url]


def mark(task: Any, what: str) -> None:
    """Tell the test where this run is: ``<task id>.<pid>.<what>``."""
    (MARKS / f"{task.request.id}.{os.getpid()}.{what}").write_text(str(time.time()))


def effect(task: Any, item: Any, pause: float) -> dict[str, Any]:
    first_run = not any(MARKS.glob(f"{task.request.id}.*.started"))  # a redelivered copy does not pause
    mark(task, "started")
    time.sleep(pause if first_run else 0.0)  # the test pauses, kills or duplicates the run here
    fence, run = task.fence, {"id": task.request.id, "pid": os.getpid()}
    if isinstance(fence.store, FencedConnectionStore):  # the lease row is checked in this transaction
        with fence.transaction() as conn:
            conn.execute(INSERT, {"k": fence.key, "t": fence.token, **run})
    else:  # a Redis or etcd lease: the resource checks the token itself
        with user_db().begin() as conn:
            conn.execute(insert(accounts).values(key=fence.key, writes=0).on_conflict_do_nothing())
            values = {
                "writes": accounts.c.writes + 1,
                "token": fence.token,
                "task_id": run["id"],
                "pid": run["pid"],
            }
            fenced_update(conn, accounts, values, accounts.c.key == fence.key, fence.token)
    mark(task, "wrote")
    return {"item": item, "token": fence.token, "pid": os.getpid()}


@app.task(base=FencedTask, bind=True)
def record(self: Any, item: Any, pause: float = 0.0) -> dict[str, Any]:
    return effect(self, item, pause)


@app.task(base=FencedTask, bind=True, fence_key="item:{item}")
def record_keyed(self: Any, item: Any, pause: float = 0.0) -> dict[str, Any]:
    return effect(self, item, pause)


@app.task(base=FencedTask, bind=True, fence_key="item:{item}", fence_on_busy="fail")
def record_keyed_or_fail(self: Any, item: Any, pause: float = 0.0) -> dict[str, Any]:
    return effect(self, item, pause)


@app.task(base=FencedTask, bind=True, autoretry_for=(RuntimeError,), default_retry_delay=0, max_retries=3)
def flaky(self: Any, item: Any) -> dict[str, Any]:
    if self.request.retries == 0:
        mark(self, "failed")
        raise RuntimeError("first attempt fails")
    return effect(self, item, 0.0)


@app.task(base=FencedTask, bind=True, fence_interrupt=True)
def sleeper(self: Any, seconds: float) -> str:
    mark(self, "started")
    try:
        time.sleep(seconds)
    finally:
        mark(self, "ended")
    return "slept"


# An "insert if absent" that catches the duplicate key of its first transaction() block.
UNIQUE = text("INSERT INTO fence_it_unique (key) VALUES (:k)")


@app.task(base=FencedTask, bind=True)
def insert_if_absent(self: Any, item: str) -> dict[str, Any]:
    try:
        with self.fence.transaction() as conn:
            conn.execute(UNIQUE, {"k": item})
        mark(self, "inserted")
    except IntegrityError:
        mark(self, "existed")
    return {"item": item, "token": self.fence.token}


# A step whose function runs after the process knows its lease is lost.
@app.task(base=FencedTask, bind=True)
def send_parcel(self: Any, item: str) -> str:
    first_run = not any(MARKS.glob(f"{self.request.id}.*.started"))
    mark(self, "started")
    deadline = time.monotonic() + 30
    while first_run and not self.fence.lost and time.monotonic() < deadline:  # the test fences it out
        time.sleep(0.05)
    if first_run:
        mark(self, "knows-lost" if self.fence.lost else "never-lost")
    self.fence.step("send", lambda: mark(self, f"sent-{uuid.uuid4().hex[:6]}"))
    return f"sent {item}"


# The chaos suite's task: one ledger row per key, whatever the faults. On a SQL store the row commits
# with its step record (atomic_step); elsewhere a token-guarded upsert inside a step (idempotent per key,
# and a stale token cannot overwrite a newer one).
ledger = Table(
    "fence_it_ledger", MetaData(),
    Column("key", Text, primary_key=True),
    Column("token", BigInteger), Column("pid", Integer), Column("fence_token", BigInteger),
)


def _ledger_in_transaction(conn: Any, key: str, token: int) -> int:
    conn.execute(ledger.insert().values(key=key, token=token, pid=os.getpid(), fence_token=token))
    return token


def _ledger_guarded(key: str, token: int) -> int:
    row = {"key": key, "token": token, "pid": os.getpid(), "fence_token": token}
    upsert = insert(ledger).values(row).on_conflict_do_update(
        index_elements=[ledger.c.key], set_=row, where=ledger.c.fence_token <= token
    )
    with user_db().begin() as conn:
        if conn.execute(upsert).rowcount == 0:
            raise StaleToken(ledger.name, token, None, "ledger upsert")
    return token


@app.task(base=FencedTask, bind=True)
def chaos(self: Any, item: Any, pause: float = 0.0, hold: bool = False) -> dict[str, Any]:
    """The chaos suite's run. The first run of an id sleeps ``pause`` s; with ``hold``, at most that long,
    until the test writes ``<id>.release`` (so it is still running when the test stops it, however long
    the batch took to start). A redelivered copy runs at once."""
    first_run = not any(MARKS.glob(f"{self.request.id}.*.started"))
    mark(self, "started")
    if first_run:
        until = time.monotonic() + pause
        while time.monotonic() < until and not (hold and (MARKS / f"{self.request.id}.release").exists()):
            time.sleep(min(0.02 if hold else pause, max(0.0, until - time.monotonic())))
    fence = self.fence
    if isinstance(fence.store, FencedConnectionStore):
        written = fence.atomic_step("ledger", _ledger_in_transaction, fence.key, fence.token)
    else:
        written = fence.step("ledger", _ledger_guarded, fence.key, fence.token)
    mark(self, "wrote")
    return {"item": item, "ledger": written, "token": fence.token, "pid": os.getpid()}


# The writes of transaction() commit with the completion, so an
# attempt that wrote and then retried, raised, was killed or returned what cannot be stored leaves none.
@app.task(base=FencedTask, bind=True, max_retries=3, autoretry_for=(RuntimeError,), default_retry_delay=0)
def write_then(self: Any, item: Any, how: str, pause: float = 0.0) -> Any:
    fence, run = self.fence, {"id": self.request.id, "pid": os.getpid()}
    with fence.transaction() as conn:
        conn.execute(INSERT, {"k": fence.key, "t": fence.token, **run})
    mark(self, f"wrote-{self.request.retries}")  # one mark per attempt, also in one pool process
    first_run = self.request.retries == 0 and len(list(MARKS.glob(f"{self.request.id}.*.wrote-0"))) == 1
    if first_run and how == "retry":
        raise self.retry(countdown=0)
    if first_run and how == "raise":
        raise RuntimeError("the first attempt fails after its write")
    if first_run and how == "pause":
        time.sleep(pause)  # the test kills the worker here
    if how == "unserializable":
        return {item}  # a set: JSON cannot carry it, so the completion (and the write) never commits
    return {"item": item, "token": fence.token}


@app.task(base=FencedTask, bind=True)
def chaos_joined(self: Any, item: Any) -> dict[str, Any]:
    """The indeterminate-outcome soak's run: a checkpointed step, then the ledger row. On a SQL store the
    row is written with ``transaction()``, so it commits with the run's completion; elsewhere it is a
    token-guarded upsert inside a step."""
    fence = self.fence
    prepared = fence.step("prepare", lambda: {"item": item})
    if isinstance(fence.store, FencedConnectionStore):
        with fence.transaction() as conn:
            conn.execute(ledger.insert().values(key=fence.key, token=fence.token, pid=os.getpid()))
    else:
        fence.step("ledger", _ledger_guarded, fence.key, fence.token)
    return {**prepared, "token": fence.token}


# For the Canvas tests: a plain task, no fence, that records every run it gets, so a chain step or a
# chord body dispatched twice shows as two files. ``label`` names the canvas; ``value`` is what it was given
# (the previous step's result, or the chord's list of part results).
@app.task(bind=True)
def after(self: Any, value: Any, label: str) -> Any:
    run = {"id": self.request.id, "pid": os.getpid(), "value": value}
    name = f"ran.{label}.{uuid.uuid4().hex}"
    written = MARKS / f".writing.{name}"  # then renamed: a test polling runs_of never reads half a file
    written.write_text(json.dumps(run))
    os.replace(written, MARKS / name)
    return value


def runs_of(label: str, where: Path = MARKS) -> list[dict[str, Any]]:
    """Every run of ``after`` for ``label``, as it recorded it."""
    return [json.loads(path.read_text()) for path in sorted(where.glob(f"ran.{label}.*"))]


def _die_publishing(when: str, headers: dict[str, Any] | None) -> None:
    """A test writes ``die-<when>-publishing.<task id>``: the process running that task dies as it sends
    the task's next step (its completion committed, SUCCESS not stored yet). Once: the file goes first."""
    parent = (headers or {}).get("parent_id")
    marker = MARKS / f"die-{when}-publishing.{parent}"
    if parent and marker.exists():
        marker.unlink()
        os._exit(1)


def _pause_publishing(headers: dict[str, Any] | None) -> None:
    """A test writes ``pause-before-publishing.<task id>``: the process running that task waits as it sends
    the task's next step (its completion committed, SUCCESS not stored) until the file goes, and writes
    ``paused-before-publishing.<task id>`` when it gets there. Only the next step (a copy of the task sending
    itself again has the same parent id), and only the first run to get there."""
    parent, name = (headers or {}).get("parent_id"), str((headers or {}).get("task"))
    marker, paused = MARKS / f"pause-before-publishing.{parent}", MARKS / f"paused-before-publishing.{parent}"
    if parent and name.endswith(".after") and marker.exists() and not paused.exists():
        paused.write_text(str(os.getpid()))
        while marker.exists():
            time.sleep(0.01)


@before_task_publish.connect
def _die_before_publishing(headers: dict[str, Any] | None = None, **_: Any) -> None:
    _die_publishing("before", headers)
    _pause_publishing(headers)


@after_task_publish.connect
def _die_after_publishing(headers: dict[str, Any] | None = None, **_: Any) -> None:
    _die_publishing("after", headers)


# The library's errors cross a real worker's result backend intact.
@app.task
def raises(name: str) -> None:
    from celery_fence import errors

    built = {
        "LeaseHeld": lambda: errors.LeaseHeld("k", "host:1:abc-1", 4.25),
        "AlreadyDone": lambda: errors.AlreadyDone("k", 7, {"total": [1, 2]}),
        "LeaseLost": lambda: errors.LeaseLost("k", 7, "renew refused"),
        "StaleToken": lambda: errors.StaleToken("k", 7, 9, "complete", recorded=True),
        "StoreUnavailable": lambda: errors.StoreUnavailable("store down"),
        "UsageError": lambda: errors.UsageError("do not commit by hand"),
    }
    raise built[name]()
