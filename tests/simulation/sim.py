"""The simulator: one Celery app with the fenced task ``sim.work``, the simulated broker, the clock adapter,
and one store; :meth:`Simulator.run` runs one program and returns its :class:`~tests.simulation.world.World`.

The memory store is new for every program (on the simulation's clock). A SQL store is one database for
all programs, each program on keys of its own; its stored times are moved back when the clock moves on
(the contract suite's way of expiring leases), so store time and the workers' clock agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery import Celery
from sqlalchemy import text

from celery_fence import FencedTask
from celery_fence import task as task_module
from celery_fence._runtime import OwedRecords, Renewer, runtime_for
from celery_fence.signals import store_wait_exhausted
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock

from .bare import BareWorker
from .broker import SimBroker
from .chooser import Chooser
from .clock import install_clock, trace_decisions
from .faults import SimStore
from .world import INTERVAL, TTL, World

__all__ = ["Simulator"]

TABLES = (  # the body's effects, a row its insert-if-absent always finds, the atomic steps' effects
    "CREATE TABLE IF NOT EXISTS sim_effects (key TEXT, token BIGINT, task TEXT)",
    "CREATE TABLE IF NOT EXISTS sim_unique (k TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS sim_steps (key TEXT, name TEXT, token BIGINT)",
    "INSERT INTO sim_unique SELECT 'taken' WHERE NOT EXISTS (SELECT 1 FROM sim_unique)",
)
_RUNNING: list[Simulator] = []  # the simulator whose program runs now
_PROGRAMS = itertools.count(1)  # across simulators: task ids must not meet in the process's memory backend
STORE_WAIT = 60.0  # fence_store_wait: a retry's longest countdown here (180 s) is longer


def _active() -> Simulator:
    return _RUNNING[0]


def late_interrupt(world: World | None) -> None:
    """A soft time limit lands once the run's completion answered, in the run's last step, as a signal
    handler's exception would: when the body's ``late_base`` asked for one (never in a worker that died)."""
    if world is not None and world.stack and world.stack[-1].late_base and not world.stack[-1].dead:
        world.stack[-1].late_base = False
        world.say("  a soft time limit lands after the completion answered")
        raise SoftTimeLimitExceeded("sim: soft time limit after the completion answered")


def _install_late_interrupt() -> Callable[[], None]:
    """The run's last step is its host's ``released`` (in ``Run``'s ``finally``); 8908ba9 had the task's
    ``ended`` instead (``SimTask.ended``). Returns the undo."""
    host = getattr(task_module, "_Host", None)
    if host is None or getattr(host.released, "sim", False):  # old code, or installed already
        return lambda: None
    original = host.released

    def released(self: Any, fence: Any) -> None:
        original(self, fence)
        late_interrupt(_active().world if _RUNNING else None)

    released.sim = True  # type: ignore[attr-defined]
    host.released = released

    def undo() -> None:
        host.released = original

    return undo


class SimTask(FencedTask):  # type: ignore[misc]
    """``sim.work``'s class (on 8908ba9 its ``ended`` was the run's last step: :func:`late_interrupt`)."""

    sim: Simulator | None = None

    def ended(self, fence: Any) -> None:
        super().ended(fence)
        late_interrupt(self.sim.world if self.sim is not None else None)


class Simulator:
    def __init__(self, sql_store: Any = None, mode: str = "lease") -> None:
        """``mode``: ``fence_mode`` (the app's): ``"lease"``, or ``"commit"`` (a fenced commit: no lease,
        the key claimed by the run's completion; emulated on the memory store)."""
        self.clock = FakeClock()
        self.mode = mode
        self.sql_store = sql_store
        self.sql = sql_store is not None
        self.world: World | None = None
        self.transactions: list[Any] = []  # the runs' transactions (SimStore): open ones hold the time
        self._behind = 0.0  # seconds the SQL store's stored times still have to move back
        self.app = app = Celery("sim", broker="memory://", backend="cache+memory://", set_as_current=False)
        app.conf.update(
            fence_store_url="memory://", fence_lease_ttl=TTL, fence_renew_interval=INTERVAL,
            task_acks_late=True, fence_store_wait=STORE_WAIT, fence_max_recoveries=2, fence_mode=mode,
        )
        self._define_tasks(app)
        self.runtime = runtime_for(app)
        # The patched modules are shared by every simulator of the process: they ask the one running now.
        now, sleep = (lambda: _active().clock()), (lambda seconds: _active()._sleep(seconds))
        self.undo_clock = install_clock(self.runtime, now, sleep)
        self.undo_trace = trace_decisions(lambda line: _active()._world().say(line))
        self.undo_late = _install_late_interrupt()
        self.broker = SimBroker(app, self.clock, lambda message: self._world().sent(message))
        self.bare = BareWorker(self)  # Run through a fake host: the same programs without the tracer
        uid = f"sim-{id(self)}"
        store_wait_exhausted.connect(self._gave_up, weak=False, dispatch_uid=f"{uid}-gave-up")
        if self.sql:
            sql_store.migrate()  # the stored times move from the first program on
            with sql_store.engine.begin() as conn:
                for statement in TABLES:
                    conn.execute(text(statement))

    def _define_tasks(self, app: Celery) -> None:
        sim = self

        @app.task(base=SimTask, bind=True, fence_key="sim:{n}", name="sim.work", shared=False)
        def work(self: Any, n: str) -> Any:
            return sim._world().body(self, n)

        @app.task(name="sim.link", shared=False)
        def link(result: Any) -> None:
            """A chain's next task: only counted (its message is captured, never run)."""

        @app.task(name="sim.errback", shared=False)
        def errback(task_id: str) -> None:
            """A link_error: only counted."""

        work.sim = sim
        self.work, self.link, self.errback = work, link, errback

    def _world(self) -> World:
        assert self.world is not None
        return self.world

    def run(self, chooser: Chooser, eager: bool = False, bare: bool = False) -> World:
        """One program: a fresh store (memory) or fresh keys (SQL), a fresh renewer, the program, settled."""
        number = next(_PROGRAMS)
        _RUNNING[:] = [self]
        raw = self.sql_store if self.sql else MemoryStore(clock=self.clock)
        store = SimStore(raw, self)
        runtime = self.runtime
        runtime._store = store
        runtime._renewer = renewer = Renewer(store, INTERVAL, clock=self.clock)
        renewer._ensure_thread = lambda: None  # type: ignore[method-assign]  # ticked by the program
        runtime.owed = OwedRecords()
        self.world = world = World(self, chooser, store, raw, f"p{number}-", eager)
        world.bare = bare
        world.program()
        return world

    # -- the world's faults.Faults, by delegation (the store wrapper holds the simulator) --

    def outcome(self, call: str, key: str | None, options: tuple[str, ...]) -> str:
        return self._world().outcome(call, key, options)

    def pause(self) -> None:
        self._world().pause()

    def dying(self) -> None:
        self._world().dying()

    def alive(self) -> None:
        self._world().alive()

    # -- time --

    def move(self, seconds: float) -> None:
        """The clock moves on; a SQL store's stored times move back by as much (store time moves on).

        Not while a run's transaction is open (it locks the lease row; on SQLite the whole database): the
        stored times move once it has ended, at the next move or the end of the delivery (``catch_up``).
        """
        self.clock.advance(seconds)
        self._behind += seconds
        self.catch_up()

    def catch_up(self) -> None:
        if not self.sql or not self._behind or any(tx.open for tx in self.transactions):
            return
        self.transactions = []
        with self.sql_store.engine.begin() as conn:
            conn.execute(text(
                "UPDATE fence_leases SET expires_at = expires_at - :s, finished_at = finished_at - :s, "
                "recovered_at = recovered_at - :s"
            ), {"s": self._behind})
        self._behind = 0.0

    def _sleep(self, seconds: float) -> None:
        self._world().advance(max(0.0, float(seconds)))

    # -- signals --

    def _gave_up(self, sender: Any = None, task_id: str = "", waited: float = 0.0, **fields: Any) -> None:
        world = self.world
        if world is None or _active() is not self:  # every simulator hears the signal
            return
        world.rec.gave_up.add(task_id)
        if world.eager:  # apply() has no queue to wait in: it gives up at once, by design
            return
        since = world.rec.outage_since.get(task_id, world.now())
        if world.now() - since < STORE_WAIT:
            world.violation(
                f"{task_id} gave up waiting out the store ('unavailable for {waited:.0f}s'), though it "
                f"answered {world.now() - since:.1f}s ago (fence_store_wait {STORE_WAIT:g}s)"
            )

    def close(self) -> None:
        self.undo_clock()
        self.undo_trace()
        self.undo_late()
        store_wait_exhausted.disconnect(dispatch_uid=f"sim-{id(self)}-gave-up")
        self.runtime._store = None
        self.runtime.close()
