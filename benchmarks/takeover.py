"""Takeover latency after SIGKILL, against ttl + renew interval (ttl 2 s, interval ttl / 3).

Prefork workers (``-c 2``, acks_late, no reject-on-lost: Celery does not redeliver the killed run) share a
queue: two, plus one per whole-worker kill. A long ``FencedTask`` starts; once its lease shows in the store,
the driver waits a random part of the renew cycle, SIGKILLs the holder (its pid is in the lease's owner,
``host:pid:uuid``) and at once sends the same task id again. The figure is the store time from the kill to
the key's next acquisition (a history event ``acquire`` or ``takeover`` with a newer token); the driver and
the stores share this machine's clock.

- *pool process killed*: only the child dies; the worker's main process sees it and releases the lease
  (celery-fence's ``FencedRequest``), so the copy can acquire without waiting for the ttl; but a copy that
  comes before that release finds the lease held and comes back when it would have expired;
- *whole worker killed*: the worker's process group dies; nobody releases, the lease must expire: this is
  the case the ttl + interval bound is for. Another worker runs the copy.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import uuid
from typing import Any

from .services import REDIS_URL, pg_schema, redis_client
from .stats import summary
from .stores import STORES, lease_store, opened
from .workers import Worker, wait_for

QUEUE = "fence_bench.takeover"
TTL = 2.0
INTERVAL = TTL / 3


def _trial(app: Any, store: Any, workers: list[Worker], whole_worker: bool) -> tuple[float, str]:
    """One kill; (seconds from the kill to the next acquisition, the history event that made it)."""
    sleeper, task_id = app.tasks["bench.sleeper"], str(uuid.uuid4())
    sleeper.apply_async((60.0,), task_id=task_id, queue=QUEUE)
    state = wait_for(lambda: _held(store, task_id), 30, "the long run's lease")
    time.sleep(random.uniform(0, 2 * INTERVAL))  # kill anywhere in the renew cycle
    pid = int(state.owner.split(":")[1])
    holder = next((w for w in workers if pid in w.children()), None)
    killed_at = time.time()
    if whole_worker and holder is not None:
        os.killpg(os.getpgid(holder.proc.pid), signal.SIGKILL)
        holder.proc.wait(10)
        time.sleep(0.2)  # let Redis drop the dead worker's BRPOP first, or it would hand it the copy (lost)
    else:
        os.kill(pid, signal.SIGKILL)
    sleeper.apply_async((0.0,), task_id=task_id, queue=QUEUE)  # the same id, sent again at once
    event = wait_for(lambda: _next_holder(store, task_id, state.token), 30, "the next holder", poll=0.01)
    wait_for(lambda: (s := store.get(task_id)) is not None and s.done, 30, "the second run's completion")
    if whole_worker and holder is not None:  # the other workers go on
        holder.stop()
        workers.remove(holder)
    return float(event.at) - killed_at, event.event


def _held(store: Any, key: str) -> Any:
    state = store.get(key)
    return state if state is not None and state.owner and state.expires_in else None


def _next_holder(store: Any, key: str, token: int) -> Any:
    events = store.history(key)
    return next((e for e in events if e.event in ("acquire", "takeover") and e.token > token), None)


def _unexpected(errors: str) -> str:
    """The worker's error lines, less those about the processes this benchmark killed."""
    expected = ("WorkerLostError", "signal 9", "SIGKILL", "Traceback", "exited with")
    return "\n".join(line for line in errors.splitlines() if not any(e in line for e in expected))[-1000:]


def _stop_all(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


def _case(latencies: list[tuple[float, str]], bound: float) -> dict[str, Any]:
    seconds = [s for s, _ in latencies]
    events = sorted({e for _, e in latencies})
    return {"seconds": summary(seconds), "events": events, "within_bound": max(seconds) <= bound}


def run(trials: int, log: Any, stores: tuple[str, ...] = STORES, worker_trials: int = 2) -> dict[str, Any]:
    from .bench_app import app

    bound = TTL + INTERVAL
    settings = {"ttl": TTL, "interval": round(INTERVAL, 3), "trials": trials, "worker_trials": worker_trials}
    out: dict[str, Any] = {"settings": settings}
    with pg_schema("takeover") as schema:
        for kind in stores:
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(lease_store(kind, schema)).url
                env = {"FENCE_BENCH_STORE": url, "FENCE_BENCH_TTL": str(TTL), "FENCE_BENCH_BROKER": REDIS_URL}
                env |= {"FENCE_BENCH_REJECT_ON_LOST": "0", "FENCE_BENCH_PG_DSN": schema.dsn}
                workers: list[Worker] = []
                stack.callback(_stop_all, workers)
                names = [f"takeover-{kind}-{i}" for i in range(2 + worker_trials)]  # one dies per whole kill
                workers += [Worker(name, env, QUEUE, wait=False) for name in names]
                for worker in workers:
                    worker.wait_ready()
                store = stack.enter_context(opened(url))
                child = [_trial(app, store, workers, False) for _ in range(trials)]
                whole = [_trial(app, store, workers, True) for _ in range(worker_trials)]
                errors = "\n".join(_unexpected(w.errors()) for w in workers).strip()
            out[kind] = {
                "pool_process_killed": _case(child, bound),
                "whole_worker_killed": _case(whole, bound),
                "bound_ttl_plus_interval": round(bound, 3),
                "worker_errors": errors,
            }
            c, w = out[kind]["pool_process_killed"]["seconds"], out[kind]["whole_worker_killed"]["seconds"]
            child_text = f"pool process killed {c['median']:.2f} s median ({c['max']:.2f} max)"
            whole_text = f"whole worker killed {w['median']:.2f} s median ({w['max']:.2f} max)"
            log(f"  {kind}: {child_text}; {whole_text}; bound {bound:.2f} s")
    with redis_client() as client:
        client.delete(QUEUE)
    return out
