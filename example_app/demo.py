"""``python -m example_app demo``: the whole story on two real workers, then a summary and a verdict.

Orders run through reserve -> charge -> ship -> notify while the demo injects the faults that make Celery
run a task twice: duplicate deliveries (same id and new ids), a worker process paused past its lease and
resumed (its stale writes are refused), and a worker process killed mid-pipeline (the filesystem broker
loses its message; recovery sends it again and the new run resumes after the last committed step).
Exits non-zero if any invariant fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from celery_fence import open_store
from celery_fence.stores.base import FencedConnectionStore
from celery_fence.verify import verify_store

from . import settings, shop

STEPS = ("reserve", "charge", "ship")
START = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - START:5.1f}s] {message}", flush=True)


class Workers:
    """Two real ``celery worker`` processes, each in its own process group, stopped by pid."""

    def __init__(self, count: int = 2) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [settings.STATE / f"worker{i}.log" for i in range(1, count + 1)]
        for i, log in enumerate(self.logs, 1):
            cmd = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_app.app",
                "worker",
                "-P",
                "prefork",
                "-c",
                "2",
                "-n",
                f"demo{i}@%h",
                "-l",
                "INFO",
                "--logfile",
                str(log),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--fence-recover",
                "--fence-recover-interval",
                "1",
            ]
            with open(log.with_suffix(".err"), "wb") as stderr:  # what it says before its log is set up
                self.procs.append(
                    subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)
                )

    def wait_until_ready(self) -> None:
        _wait(self._ready, 60, "workers")

    def _ready(self) -> bool:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                code = proc.returncode
                raise SystemExit(f"demo: worker {log.stem} exited with code {code} before it was ready")
        return all(log.exists() and "ready." in log.read_text() for log in self.logs)

    def tails(self, lines: int = 15) -> str:
        """The end of each worker's log and stderr, for a demo that stops before its summary."""
        return "\n".join(
            f"--- {path}, its last {lines} lines:\n"
            + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
            for path in (log, log.with_suffix(".err"))
            if path.exists() and path.stat().st_size
        )

    def settle(self, quiet: float = 2.0, bound: float = 30.0) -> None:
        """Wait until the workers' logs have been quiet for ``quiet`` seconds (at most ``bound``)."""
        deadline, size, since = time.monotonic() + bound, -1, time.monotonic()
        while time.monotonic() < deadline:
            now_size = sum(log.stat().st_size for log in self.logs)
            if now_size != size:
                size, since = now_size, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.1)

    def log_count(self, text: str) -> int:
        return sum(log.read_text().count(text) for log in self.logs if log.exists())

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.05)
    return value


def _in_flight(engine: Any, after: str, before: str) -> tuple[int, int] | None:
    """An order that committed ``after`` but not ``before`` yet, and the pid running it."""
    data = shop.counts(engine)
    done = {(order, step) for order, step in data["steps"]}
    for order, step in data["steps"]:
        if step == after and (order, before) not in done:
            pid = _pid_of(engine, order, after)
            if pid:
                return order, pid
    return None


def _pid_of(engine: Any, order: int, step: str) -> int | None:
    from sqlalchemy import select

    with engine.connect() as conn:
        query = select(shop.audit.c.pid).where(shop.audit.c.order_id == order, shop.audit.c.step == step)
        return conn.execute(query).scalar()


def run(orders: int = 20) -> int:
    from .app import process_order, shop_engine

    if settings.STATE.exists() and "FENCE_DEMO_KEEP" not in os.environ:
        shutil.rmtree(settings.STATE)
    settings.make_dirs()
    store = open_store(settings.STORE_URL)
    if not isinstance(store, FencedConnectionStore):
        raise SystemExit(
            "demo: the shop's tables commit with their steps in the store's database, so "
            "FENCE_STORE_URL must name a SQL store (sqlite:// or postgresql://); Redis serves as the "
            "broker: CELERY_BROKER_URL"
        )
    engine = shop_engine()
    store.migrate()
    shop.create(engine)
    say(f"store {settings.STORE_URL}, broker {settings.BROKER_URL}, lease ttl {settings.LEASE_TTL}s")
    workers = Workers()
    try:
        workers.wait_until_ready()
        say(f"2 workers ready (prefork, 2 processes each, --fence-recover); sending {orders} orders")
        half = orders // 2
        results = [process_order.apply_async((n,)) for n in range(1, half + 1)]
        for n, result in enumerate(results[:5], 1):
            process_order.apply_async((n,), task_id=result.id)  # the broker delivers a copy
        for n in range(6, 11):
            process_order.apply_async((n,))  # a producer sends the same order again, with a new id
        say("sent 10 duplicates: 5 redeliveries of the same task id, 5 resends with new ids")
        faults = {"killed": kill_fault(store, engine)}
        say(f"sending orders {half + 1}..{orders}")
        for n in range(half + 1, orders + 1):
            process_order.apply_async((n,))
        faults["paused"] = pause_fault(store, engine)
        progress(store, orders)
        workers.settle()  # duplicates still in flight come back and are absorbed
    except SystemExit as exc:  # a wait ran out: what the workers said is the first thing to read
        raise SystemExit(f"{exc}\n{workers.tails()}") from None
    finally:
        workers.stop()
    return summarize(store, engine, orders, workers, faults)


def kill_fault(store: Any, engine: Any) -> int:
    order, pid = _wait(
        lambda: _in_flight(engine, "reserve", "charge"), 30, "an order between reserve and charge"
    )
    os.kill(pid, signal.SIGKILL)
    say(f"killed worker process {pid} in order {order} after 'reserve' (SIGKILL): its message is gone")
    _wait(lambda: store.get(f"order:{order}").done, 60, f"order {order} to be recovered")
    say(f"order {order}: {_who_took_over(store, f'order:{order}')}; it skipped 'reserve' and finished")
    return order


def _who_took_over(store: Any, key: str) -> str:
    events = [e.event for e in store.history(key)]
    if "recovered" in events:
        return "recovery re-sent it once the lease expired, and the new run took over"
    return "a duplicate delivery of it, retrying, took over once the lease expired"


def pause_fault(store: Any, engine: Any) -> int:
    order, pid = _wait(lambda: _in_flight(engine, "charge", "ship"), 30, "an order between charge and ship")
    os.kill(pid, signal.SIGSTOP)
    say(f"paused worker process {pid} in order {order} after 'charge' (SIGSTOP)")
    key = f"order:{order}"
    _wait(lambda: any(e.event == "takeover" for e in store.history(key)), 60, "the takeover")
    say(f"order {order}: {_who_took_over(store, key)}, resuming at 'ship'")
    _wait(lambda: store.get(key).done, 60, f"order {order} to finish")
    os.kill(pid, signal.SIGCONT)
    say(f"resumed process {pid}: its next write carries a stale token")
    _wait(lambda: any(e.event == "refused" for e in store.history(key)), 30, "the refusal")
    say(f"order {order}: the stale run's 'ship' was refused; nothing it wrote after the takeover exists")
    return order


def progress(store: Any, orders: int, quiet_bound: float = 60.0) -> None:
    """Report pipelines as they complete; give up when none has for ``quiet_bound`` seconds."""
    last, since = -1, time.monotonic()
    while True:
        done = sum(1 for n in range(1, orders + 1) if (s := store.get(f"order:{n}")) and s.done)
        if done != last:
            say(f"{done}/{orders} pipelines complete")
            last, since = done, time.monotonic()
        if done == orders:
            return
        if time.monotonic() - since > quiet_bound:
            raise SystemExit(f"demo: no pipeline completed in {quiet_bound:g}s ({done}/{orders} are)")
        time.sleep(0.2)


def summarize(store: Any, engine: Any, orders: int, workers: Workers, faults: dict[str, Any]) -> int:
    events = Counter(e.event for e in store.history())
    data = shop.counts(engine)
    per_order = Counter(data["steps"])
    once = all(per_order[(n, step)] == 1 for n in range(1, orders + 1) for step in STEPS)
    violations = verify_store(store)
    checks = {
        "every pipeline completed": all(store.get(f"order:{n}").done for n in range(1, orders + 1)),
        "each step executed exactly once per pipeline": once and len(data["steps"]) == orders * len(STEPS),
        "one payment, one shipment, one e-mail per order": sorted(data["payments"])
        == sorted(data["shipments"])
        == sorted(data["outbox"])
        == list(range(1, orders + 1)),
        "stock went down by exactly the orders": data["stock"] == shop.INITIAL_STOCK - orders,
        "fence verify found no violation": not violations,
    }
    rows = [
        ("pipelines", f"{orders}"),
        ("takeovers", str(events["takeover"])),
        ("stale writes refused", str(events["refused"])),
        ("duplicates absorbed", str(workers.log_count("absorbed:"))),
        ("runs re-sent by recovery", str(events["recovered"])),
        ("steps executed per pipeline", "reserve 1, charge 1, ship 1, notify 1" if once else "NOT ONCE"),
        ("audit rows", f"{len(data['steps'])} (= {orders} x {len(STEPS)})"),
        ("violations found by verify", str(len(violations))),
    ]
    print("\n" + "\n".join(f"  {name:<30} {value}" for name, value in rows))
    print()
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for violation in violations:
        print(f"  violation: {violation}")
    failed = [name for name, ok in checks.items() if not ok]
    print(
        f"\n{'all invariants hold' if not failed else f'{len(failed)} invariant(s) failed'}"
        f" (state and worker logs in {Path(settings.STATE)})"
    )
    store.close()
    engine.dispose()
    return 1 if failed else 0
