"""The one job of ``benchmarks/comparison.py``, guarded by the library named in ``CMP_LIB``.

Each library is used the way its README shows, with its lock expiry set to ``CMP_EXPIRY`` seconds:

- ``celery-fence``: ``base=FencedTask``, ``fence_key="job:{job}"``, the effect row written by
  ``self.fence.atomic_step`` (the row commits with the step record, in the lease-checked transaction);
- ``celery-once``: ``base=QueueOnce``, Redis backend, ``once={"timeout": expiry}`` (a producer lock);
- ``celery-singleton``: ``base=Singleton``, Redis backend, ``lock_expiry=expiry`` (a producer lock);
- ``fencekit``: ``@idempotent_task(guard, lock, ..., lock_ttl=expiry, retry_on_in_progress=True)`` as in its
  README (an idempotency key plus a worker lock with a fencing token the body never sees);
- ``relier``: ``@rl_task(idempotent=True)`` on relier's own Celery app, its in-flight lock TTL set by
  ``RELIER_IDEMPOTENCY_INFLIGHT_TTL`` (a worker lock keyed by the arguments).

The body is the same everywhere: write ``<job>.<pid>.started``, work ``CMP_WORK`` seconds (the driver
SIGSTOPs or SIGKILLs the process here), insert one effect row, write ``.wrote``, work ``CMP_TAIL`` seconds
more (a kill after the write lands here), write ``.ended``. Only one library is imported per process:
relier connects worker signals for every app in the process.

``python -m benchmarks.comparison_app send JOB`` sends the job the library's way and prints what happened.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

LIB = os.environ.get("CMP_LIB", "celery-fence")
REDIS = os.environ.get("CMP_REDIS", "redis://127.0.0.1:6379")
PG_DB = os.environ.get("CMP_PG_DB", "celery_fence_compare")
PG = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}"
EXPIRY = float(os.environ.get("CMP_EXPIRY", "3"))
WORK = float(os.environ.get("CMP_WORK", "1.0"))
TAIL = float(os.environ.get("CMP_TAIL", "1.5"))
MARKS = Path(os.environ.get("CMP_DIR", "/tmp"))
QUEUE = "default" if LIB == "relier" else f"cmp.{LIB}"
INSERT = "INSERT INTO compare_effects (lib, job, pid) VALUES (%s, %s, %s)"
_conn: Any = None


def mark(job: str, what: str) -> None:
    (MARKS / f"{job}.{os.getpid()}.{what}").write_text(str(time.time()))


def insert_row(job: str) -> int:
    """One effect row, committed at once (psycopg, autocommit): what an unfenced task body does."""
    global _conn  # noqa: PLW0603  (one connection per pool process, made after the fork)
    import psycopg

    deadline = time.monotonic() + 30  # other test runs on this machine can use up max_connections
    while _conn is None or _conn.closed:
        try:
            _conn = psycopg.connect(PG, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    _conn.execute(INSERT, (LIB, job, os.getpid()))
    return os.getpid()


def body(job: str, write: Callable[[], Any]) -> dict[str, Any]:
    mark(job, "started")
    try:
        time.sleep(WORK)  # the stall or the kill before the write happens here
        write()
        mark(job, "wrote")
        time.sleep(TAIL)  # a kill after the write, before the run completes and acks, happens here
    finally:
        mark(job, "ended")
    return {"job": job, "pid": os.getpid()}


def _celery_app() -> Any:
    from celery import Celery

    app = Celery("comparison", broker=f"{REDIS}/5", backend=f"{REDIS}/5")
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        result_expires=600,
    )
    return app


if LIB == "celery-fence":
    from sqlalchemy import text

    from celery_fence import FencedTask

    app = _celery_app()
    app.conf.update(
        fence_store_url=f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_DB}",
        fence_lease_ttl=EXPIRY,
    )
    _INSERT_SA = text("INSERT INTO compare_effects (lib, job, pid) VALUES (:lib, :job, :pid)")

    def _insert_in(conn: Any, job: str) -> int:
        conn.execute(_INSERT_SA, {"lib": LIB, "job": job, "pid": os.getpid()})
        return os.getpid()

    @app.task(base=FencedTask, bind=True, name="cmp.job", fence_key="job:{job}")
    def job_task(self: Any, job: str) -> dict[str, Any]:
        return body(job, lambda: self.fence.atomic_step("effect", _insert_in, job))

    def send(job: str) -> str:
        return f"sent {job_task.apply_async((job,)).id}"

elif LIB == "celery-once":
    from celery_once import AlreadyQueued, QueueOnce

    app = _celery_app()
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": f"{REDIS}/6", "default_timeout": int(EXPIRY)},
    }

    @app.task(base=QueueOnce, bind=True, name="cmp.job", once={"timeout": int(EXPIRY)})
    def job_task(self: Any, job: str) -> dict[str, Any]:
        return body(job, lambda: insert_row(job))

    def send(job: str) -> str:
        try:
            return f"sent {job_task.apply_async((job,)).id}"
        except AlreadyQueued as exc:
            return f"refused at the producer: AlreadyQueued ({exc.countdown:.1f} s left)"

elif LIB == "celery-singleton":
    from celery_singleton import Singleton

    app = _celery_app()
    app.conf.singleton_backend_url = f"{REDIS}/6"

    @app.task(base=Singleton, bind=True, name="cmp.job", lock_expiry=int(EXPIRY))
    def job_task(self: Any, job: str) -> dict[str, Any]:
        return body(job, lambda: insert_row(job))

    def send(job: str) -> str:
        task_id = f"{job}:{time.monotonic_ns()}"
        result = job_task.apply_async((job,), task_id=task_id)
        if result.id != task_id:
            return f"refused at the producer: returned {result.id}"
        return f"sent {result.id}"

elif LIB == "fencekit":
    import redis
    from fencekit import DistributedLock, IdempotencyGuard, idempotency_key
    from fencekit.celery import idempotent_task

    app = _celery_app()
    _redis = redis.Redis.from_url(f"{REDIS}/6", decode_responses=True)  # made at import, as in its README
    guard = IdempotencyGuard(_redis, prefix="cmp_fk")
    lock = DistributedLock(_redis, prefix="cmp_fk")

    @app.task(bind=True, name="cmp.job")
    @idempotent_task(
        guard,
        lock,
        key=lambda job: idempotency_key({"job": job}, namespace="cmp"),
        lock_resource=lambda job: f"cmp:{job}",
        idempotency_ttl=timedelta(hours=1),
        lock_ttl=timedelta(seconds=EXPIRY),
        retry_on_in_progress=True,
    )
    def job_task(self: Any, job: str) -> dict[str, Any]:
        return body(job, lambda: insert_row(job))

    def send(job: str) -> str:
        return f"sent {job_task.apply_async((job,)).id}"

elif LIB == "relier":
    from relier import rl_task
    from relier.tasks.app import celery_app as app  # the worker's -A target

    @rl_task(idempotent=True, name="cmp.job")
    def job_task(job: str) -> dict[str, Any]:
        return body(job, lambda: insert_row(job))

    def send(job: str) -> str:
        return f"sent {job_task.push(job).id}"

else:
    raise SystemExit(f"CMP_LIB={LIB!r} is not one of the compared libraries")


if __name__ == "__main__" and sys.argv[1:2] == ["send"]:
    print(send(sys.argv[2]))
