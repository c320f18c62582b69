"""One simulated program: a queue of messages, one store, one clock, and the real FencedTask run code.

The program's decisions come from a :class:`~tests.simulation.chooser.Chooser`: which message is delivered
next (or delivered twice, or sent again under a new task id), what each body does, each store call's outcome,
admin actions, recovery passes, deaths. Everything runs synchronously in this thread: a "concurrent" copy is
a delivery nested inside another run's body, and the renewer never runs as a thread (time passing ticks it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded, WorkerLostError
from celery import states
from celery.exceptions import Ignore, Reject
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from celery_fence.errors import FenceError, StoreUnavailable
from celery_fence.recovery import recover_abandoned

from .broker import Message
from .chooser import Chooser
from .faults import WorkerDied

__all__ = ["COMPLETIONS", "TTL", "World"]

# Long enough that the milliseconds of real time a program takes never decide an expiry on a SQL store
# (their clock is real time, moved back by the simulation's: ``Simulator.move``).
TTL = 30.0
INTERVAL = 10.0
GRACE = 10.0
PAST_TTL = TTL + 5.0
MAX_ACTIONS = 8
MAX_OPS = 4
SETTLE_STEPS = 80
FAULT_WEIGHTS = {"rare": (24, 1, 1, 1, 1, 1, 1), "often": (4, 1, 1, 1, 1, 1, 1)}  # ok, before, ... base
ENDS = ("return", "raise", "retry", "reject", "ignore", "soft_limit", "sysexit", "late_base")
USER_ENDS = {"raise", "retry-none", "reject", "ignore", "soft_limit", "sysexit"}
PLAIN_OPS = ("step", "work", "check")
SQL_OPS = ("tx", "tx_caught", "atomic_step")
WILD_OPS = ("lose", "expire", "admin_release", "nested", "owner_reuse")
# fence_mode="commit": no steps (refused by design), no lease to lose or let expire. On SQLite the run's
# transaction holds the one write lock from its start, so nothing else writes during its body; on
# PostgreSQL it locks no row before its claim, so a copy may run inside it (nested) and claim first.
COMMIT_OPS = {
    "plain": ("work", "check"),
    "sql": ("tx", "tx_caught"),
    "wild": ("admin_release", "nested", "owner_reuse"),
    "sqlite_wild": (),
    "postgresql_wild": ("nested",),
}
ACTIONS = ("end", "deliver", "duplicate", "send_new", "admin_release", "advance", "prune", "recover", "pause",
           "actor_acquire", "outage")
ACTION_WEIGHTS = (2, 8, 2, 2, 1, 1, 1, 1, 1, 1, 2)
ORIGINS = {  # who sent the message that ran a body again after its FAILURE
    "recovery": "sent by recovery",
    "duplicate": "a duplicate the broker delivered",
    "twice": "a message sent before the FAILURE: the broker delivered it twice",
    "copy": "a copy the fence sent before the FAILURE (its fence_* headers)",
}
COMPLETIONS = ("complete", "commit")  # the history events of a completion: lease mode's, a fenced commit's
OP_WEIGHTS = {"return": 6, "step": 3, "tx": 3, "tx_caught": 2, "nested": 2}  # 1 for the others


@dataclass
class Delivery:
    message: Message
    dead: bool = False
    clean: bool = True  # no fault, no interference: a body that returned must end SUCCESS
    returned: bool = False
    late_base: bool = False


@dataclass
class BodyRun:
    task_id: str
    token: int
    retries: int
    end: str = ""
    writes: int = 0
    owner: str = ""  # fence_mode="commit": its token is 0 until the claim; the owner names the run


@dataclass
class Record:
    """What the program saw, for the checks."""

    tasks: dict[str, str] = field(default_factory=dict)  # task id -> key
    bodies: dict[str, list[BodyRun]] = field(default_factory=dict)
    token_task: dict[int, str] = field(default_factory=dict)
    owner_task: dict[str, str] = field(default_factory=dict)  # a run's owner -> its task id
    links: Counter[str] = field(default_factory=Counter)  # parent task id -> link callbacks sent
    errbacks: Counter[str] = field(default_factory=Counter)
    acquired: list[tuple[str, int, str]] = field(default_factory=list)  # (key, token, by) answered
    gave_up: set[str] = field(default_factory=set)
    outage_since: dict[str, float] = field(default_factory=dict)  # task id -> first failure since an answer
    eager: dict[str, tuple[str, Any]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    limited: set[str] = field(default_factory=set)  # task ids that met the documented limit N4


class World:
    def __init__(self, sim: Any, chooser: Chooser, store: Any, raw: Any, prefix: str, eager: bool) -> None:
        self.sim, self.chooser, self.store, self.raw = sim, chooser, store, raw
        self.prefix, self.eager = prefix, eager
        self.bare = False  # run through bare.BareWorker (Run and a fake host) instead of Celery's tracer
        self.strict_failure = getattr(sim, "strict_failure", False)  # N4 counted as a violation (its test)
        self.sql = sim.sql
        self.committing = getattr(sim, "mode", "lease") == "commit"  # fence_mode="commit"
        self.sql_name = "sqlite" if self.sql and str(sim.sql_store.url).startswith("sqlite") else "postgresql"
        self.queue: list[Message] = []
        self.seen: list[Message] = []
        self.stack: list[Delivery] = []
        self.calm = False
        self.down = False  # a store outage: every call of a run fails before the store acts
        self.faults = "rare"  # how often a store call misbehaves (drawn per program)
        self.origin = ""  # who sends now: "recovery" during a recovery pass
        self.keys: list[int] = []
        self.pruned: dict[str, Any] = {}  # key -> its state before it was pruned
        self.done_by: dict[str, int] = {}  # pruned key -> the token of its completion
        self.done_owner: dict[str, str | None] = {}  # pruned key -> the owner of its completion
        self.rec = Record()
        self._ids = 0

    # -- the clock --

    def now(self) -> float:
        return float(self.sim.clock())

    def pause(self, seconds: float = PAST_TTL) -> None:
        """Time passes with nothing renewed (a paused process, a hung call): leases expire at the store."""
        self.say(f"  clock +{seconds:g}s (no renew)")
        self.sim.move(seconds)

    def advance(self, seconds: float) -> None:
        """Time passes as it does on a live worker: the renewer ticks every half interval."""
        while seconds > 1e-9:
            step = min(seconds, INTERVAL / 2)
            self.sim.move(step)
            seconds -= step
            self.sim.runtime.renewer.tick()

    # -- what the store wrapper asks (faults.Faults) --

    def outcome(self, call: str, key: str | None, options: tuple[str, ...]) -> str:
        if self.calm or not self.stack:
            outcome = "ok"
        elif self.down:  # the store is down: nothing reaches it
            outcome = "before"
        else:
            if self.eager:  # apply() has no broker to redeliver a dead worker's message
                options = tuple(o for o in options if o != "die")
            weights = FAULT_WEIGHTS[self.faults][: len(options)]
            outcome = self.chooser.choose(f"{call} outcome", options, weights)
        if not self.stack:
            return outcome
        task_id = self.stack[-1].message.id
        if outcome != "ok":
            self.stack[-1].clean = False
            self.rec.outage_since.setdefault(task_id, self.now())
            self.say(f"    store {call}({key}) -> {outcome}")
        else:
            self.rec.outage_since.pop(task_id, None)
            self.say(f"    store {call}({key})")
        return outcome

    def dying(self) -> None:
        self.stack[-1].dead = True
        raise WorkerDied()

    def alive(self) -> None:
        if self.stack and self.stack[-1].dead:
            raise WorkerDied()

    def say(self, line: str) -> None:
        self.chooser.say(line)

    def violation(self, text_: str) -> None:
        self.say(f"VIOLATION: {text_}")
        self.rec.violations.append(text_)

    # -- messages --

    def key_of(self, n: int) -> str:
        return f"sim:{self.prefix}{n}"

    def sent(self, message: Message) -> None:
        if message.name == "sim.link":
            self.rec.links[str(message.headers.get("parent_id"))] += 1
            return
        if message.name == "sim.errback":
            self.rec.errbacks[str(json.loads(message.body)[0][0])] += 1
            return
        message.origin = self.origin
        self.say(f"  sent {message.describe()}{' by recovery' if self.origin else ''}")
        self.queue.append(message)
        self.seen.append(message)

    def send_new(self, n: int) -> None:
        self._ids += 1
        task_id = f"{self.prefix}t{self._ids}"
        self.rec.tasks[task_id] = self.key_of(n)
        self.say(f"send a new task id {task_id} for key {self.key_of(n)}")
        sim = self.sim
        sim.work.apply_async(
            (f"{self.prefix}{n}",), task_id=task_id, link=sim.link.s(), link_error=sim.errback.s()
        )

    def deliver(self, message: Message) -> None:
        if message.due > self.now():
            self.advance(message.due - self.now())
        delivery = Delivery(message)
        self.say(f"deliver {message.describe()}{' (nested)' if self.stack else ''}")
        self.stack.append(delivery)
        try:
            failed, result = self._run(message)
        except WorkerDied:
            self.say(f"  worker died running {message.id}: the message comes back")
            self.queue.append(Message(**{**message.__dict__, "redelivered": True, "due": self.now()}))
            return
        except SystemExit:
            failed, result = 1, WorkerLostError("sim: the pool process exited (SystemExit)")
            self._store_failure(message.id, result)
        finally:
            self.stack.pop()
            self.sim.catch_up()
        status, stored = self.status(message.id)
        shown = result if self.eager or not failed else stored
        ended = "ended without SUCCESS" if failed else "returned"
        self.say(f"  -> {ended}; the backend says {status} {shown!r:.120}")
        # A delivery of a task id whose FAILURE was stored before it ran (the limit above, N4) that ends
        # quietly: fence_mode="commit" refuses its claim (the FAILURE marked the key ended by the task id),
        # so the FAILURE stays its ending, or a retry sent before it (also N4) shows RETRY.
        if delivery.clean and delivery.returned and failed and message.id not in self.rec.limited:
            self.violation(
                f"{message.id}: its body returned and every store call answered, yet it ended without "
                f"SUCCESS (the backend says {status} {shown!r:.150})"
            )

    def _run(self, message: Message) -> tuple[int, Any]:
        if self.bare:
            return self.sim.bare.deliver(message)  # type: ignore[no-any-return]
        if not self.eager:
            return self.sim.broker.deliver(message)
        args, kwargs, _ = json.loads(message.body)
        sim = self.sim
        result = sim.work.apply(args, kwargs, task_id=message.id, retries=message.headers.get("retries"),
                                link=sim.link.s(), link_error=sim.errback.s())
        self.rec.eager[message.id] = (result.state, result.result)
        return (0 if result.state == states.SUCCESS else 1), result.result

    def _store_failure(self, task_id: str, exc: BaseException) -> None:
        if self.eager:
            self.rec.eager[task_id] = (states.FAILURE, exc)
        else:  # what a worker's main process stores when its pool process is lost
            self.sim.app.backend.mark_as_failure(task_id, exc)

    def status(self, task_id: str) -> tuple[str, Any]:
        if self.eager:
            return self.rec.eager.get(task_id, (states.PENDING, None))
        meta = self.sim.app.backend.get_task_meta(task_id)
        return meta["status"], meta.get("result")

    # -- the body --

    def body(self, task: Any, n: str) -> Any:
        delivery, fence, task_id = self.stack[-1], task.fence, task.request.id
        status, outcome = self.status(task_id)
        # An eager apply() that raised StoreUnavailable told its caller the outcome is unknown, not FAILURE:
        # the run it may have left (an acquire whose reply was lost) is recovery's to finish.
        unknown = self.eager and isinstance(outcome, StoreUnavailable)
        if status == states.FAILURE and not unknown:
            copy = any(name.startswith("fence_") for name in delivery.message.headers)
            origin = delivery.message.origin
            origin = origin if origin in ORIGINS else ("copy" if copy else "twice")
            how = ORIGINS[origin]
            if origin == "twice" and not self.strict_failure:
                # The documented limit (N4, docs/reliability.md): a message neither marked redelivered nor
                # sent by the fence, of a task id whose FAILURE is stored and whose release reached the
                # store, runs again (at least once); closing it needs a result-backend read per run.
                self.say(f"LIMIT: {task_id} ran its body again after its FAILURE was stored ({how})")
                self.rec.limited.add(task_id)
            else:
                self.violation(f"{task_id} ran its body again after its FAILURE was stored ({how})")
        run = BodyRun(task_id, fence.token, task.request.retries or 0, owner=fence.lease.owner)
        self.rec.bodies.setdefault(task_id, []).append(run)
        self.rec.owner_task[run.owner] = task_id
        if not self.committing:  # a fenced commit has token 0 until its claim: no acquire answered one
            self.rec.token_task[fence.token] = task_id
            self.rec.acquired.append((fence.key, fence.token, f"the run of {task_id}"))
        ops = ENDS + self._ops()
        if self.calm:
            ops = tuple(op for op in ops if op not in ("soft_limit", "sysexit", "late_base"))
        for i in range(MAX_OPS):
            op = self.chooser.choose("body op", ops, [OP_WEIGHTS.get(op, 1) for op in ops])
            self.say(f"  body of {task_id} (token {fence.token}): {op}")
            if op in ENDS:
                return self._end(task, op, run, delivery)
            self._op(task, op, run, i, delivery)
        return self._end(task, "return", run, delivery)

    def _ops(self) -> tuple[str, ...]:
        """What a body may do besides ending: fence calls, SQL writes, and (until settling) wild ones."""
        if not self.committing:
            return PLAIN_OPS + (SQL_OPS if self.sql else ()) + (() if self.calm else WILD_OPS)
        wild = COMMIT_OPS[f"{self.sql_name}_wild" if self.sql else "wild"]
        return COMMIT_OPS["plain"] + (COMMIT_OPS["sql"] if self.sql else ()) + (() if self.calm else wild)

    def _end(self, task: Any, op: str, run: BodyRun, delivery: Delivery) -> Any:
        run.end = op
        if op in ("return", "late_base"):
            delivery.returned = True
            delivery.late_base = op == "late_base"
            if delivery.late_base:
                delivery.clean = False  # SimTask.ended raises once the completion answered
            return f"result of {run.task_id} token {run.token}"
        if op == "raise":
            raise ValueError("sim: the body failed")
        if op == "retry":
            if task.max_retries is not None and run.retries >= task.max_retries:
                run.end = "retry-none"
            raise task.retry(countdown=self.chooser.choose("retry countdown", (0, 1, 180)))
        if op == "reject":
            raise Reject("sim: rejected", requeue=False)
        if op == "ignore":
            raise Ignore()
        if op == "soft_limit":
            raise SoftTimeLimitExceeded("sim: soft time limit in the body")
        raise SystemExit(1)

    def _op(self, task: Any, op: str, run: BodyRun, i: int, delivery: Delivery) -> None:
        fence = task.fence
        if op == "step":
            fence.step(f"s{i}", self._step_fn(fence, f"s{i}"))
        elif op == "work":
            self.advance(INTERVAL)
        elif op == "check":
            fence.check()
        elif op == "tx":  # a fenced commit's writes are told apart by the run's owner (its token is 0)
            by = run.owner if self.committing else run.task_id
            with fence.transaction() as conn:
                conn.execute(text("INSERT INTO sim_effects VALUES (:k, :t, :id)"),
                             {"k": fence.key, "t": fence.token, "id": by})
            run.writes += 1
        elif op == "atomic_step":  # its write commits with its step record, once per key
            fence.atomic_step(f"a{i}", self._atomic_fn(fence, f"a{i}"))
        elif op == "tx_caught":  # insert-if-absent: the row is there, IntegrityError, caught
            try:
                with fence.transaction() as conn:
                    conn.execute(text("INSERT INTO sim_unique VALUES ('taken')"))
            except IntegrityError:
                pass
        else:
            delivery.clean = False
            self._wild(op, fence)

    def _wild(self, op: str, fence: Any) -> None:
        if op == "lose":  # the renewer's on-lost path, as when a renew is refused
            self.sim.runtime.renewer._lose(fence.lease, "sim: renew refused")
        elif op == "expire":
            self.pause()
        elif op == "admin_release":
            self.admin_release(fence.key)
        elif op == "nested":
            # SQLite: one write lock, held by this run's transaction; PostgreSQL: the lease row it locks (a
            # fenced commit locks none before its claim)
            if self.sql and fence.joined and (self.sql_name == "sqlite" or not self.committing):
                return
            self.nested()
        elif op == "owner_reuse":  # another client acquires this key with the run's owner string
            if self.sql and fence.joined and self.sim.sql_store.url.startswith("sqlite"):
                return
            self.actor_acquire(fence.key, fence.lease.owner)

    def _step_fn(self, fence: Any, name: str) -> Any:
        def effect() -> str:
            self._step_called(fence, name)
            return f"value of {name}"

        return effect

    def _atomic_fn(self, fence: Any, name: str) -> Any:
        def effect(conn: Any) -> str:
            self._step_called(fence, name)
            conn.execute(text("INSERT INTO sim_steps VALUES (:k, :n, :t)"),
                         {"k": fence.key, "n": name, "t": fence.token})
            return f"value of {name}"

        return effect

    def _step_called(self, fence: Any, name: str) -> None:
        if fence.lost:
            self.violation(f"step {name} of {fence.key} ran its function after the lease was known lost")
        if name in self.raw.steps(fence.key):
            self.violation(f"step {name} of {fence.key} ran its function after the step committed")

    # -- actions of the program (top level, or nested inside a body) --

    def nested(self) -> None:
        choices = ["new"] + [m.serial for m in self.queue]
        which = self.chooser.choose("nested delivery", choices)
        if which == "new":
            n = int(self.chooser.choose("key", self.keys))
            if self.key_of(n) in self.pruned:
                return
            self.send_new(n)
            which = self.queue[-1].serial
        message = next(m for m in self.queue if m.serial == which)
        self.queue.remove(message)
        self.deliver(message)

    def admin_release(self, key: str) -> None:
        try:
            token = self.raw.force_release(key)
            self.say(f"  admin: celery fence release {key} -> token {token}")
        except FenceError as exc:
            self.say(f"  admin: release {key}: {exc}")

    def recover(self) -> Any:
        """One recovery pass (``celery fence recover``); what it sends is marked as recovery's."""
        self.origin = "recovery"
        try:
            store = _Scoped(self.raw, self.prefix)
            report = recover_abandoned(self.sim.app, store, GRACE, self.sim.runtime.config.max_recoveries)
        finally:
            self.origin = ""
        if report.resent or report.dead:
            self.say(f"recovery pass: resent {report.resent}, dead {report.dead}")
        return report

    def program(self) -> None:
        choose = self.chooser.choose
        self.sim.work.max_retries = choose("max_retries", (1, 3))
        self.keys = list(range(choose("keys", (1, 2))))
        self.faults = choose("faults", ("rare", "often"))
        self.say(f"program {self.prefix}: max_retries={self.sim.work.max_retries}, keys={self.keys}, "
                 f"store faults {self.faults}")
        for n in self.keys:
            self.send_new(n)
        for _ in range(MAX_ACTIONS):
            action = choose("action", ACTIONS, ACTION_WEIGHTS)
            if action == "end":
                break
            self.action(action)
        self.settle()

    def action(self, action: str) -> None:
        choose = self.chooser.choose
        if action == "deliver" and self.queue:
            message = choose("message", self.queue)
            self.queue.remove(message)
            self.deliver(message)
        elif action == "duplicate" and self.seen and not self.eager:  # the broker delivers a copy (same id)
            original = choose("message", self.seen)
            self.say(f"the broker delivers a duplicate of {original.id}")
            if self.rec.tasks.get(original.id) in self.pruned:
                return
            self.deliver(Message(**{**original.__dict__, "redelivered": True, "due": self.now(),
                                    "origin": "duplicate"}))
        elif action == "send_new":
            n = choose("key", self.keys)
            if self.key_of(n) not in self.pruned:
                self.send_new(n)
        elif action == "admin_release":
            self.admin_release(self.key_of(choose("key", self.keys)))
        elif action == "advance":
            self.say(f"admin: celery fence advance -> {self.raw.advance(1000)}")
        elif action == "prune":
            self.prune()
        elif action == "recover":
            self.recover()
        elif action == "pause":
            self.advance(choose("pause", (INTERVAL, PAST_TTL, 600.0)))
        elif action == "actor_acquire":
            self.actor_acquire()
        elif action == "outage":
            self.down = not self.down
            self.say(f"the store {'goes down' if self.down else 'is back'}")

    def prune(self) -> None:
        """``celery fence prune``: only once nothing of this program is queued, and its pruned keys are
        never sent again (a pruned key may run again by design); their checks use the state before."""
        if self.queue:
            return
        for n in self.keys:
            state = self.raw.get(self.key_of(n))
            if state is not None and state.done:
                self.pruned[self.key_of(n)] = state
                completes = [e for e in self.raw.history(self.key_of(n)) if e.event in COMPLETIONS]
                self.done_by[self.key_of(n)] = completes[0].token if completes else state.token
                self.done_owner[self.key_of(n)] = completes[0].owner if completes else state.owner
        self.say(f"admin: celery fence prune -> {self.raw.prune(0.0)} (keys {sorted(self.pruned)})")

    def actor_acquire(self, key: str = "", owner: str = "") -> None:
        """The store API used directly, with a repeated owner string."""
        key = key or f"actor:{self.prefix}{self.chooser.choose('actor key', (0, 1))}"
        owner = owner or self.chooser.choose("actor owner", ("actor-a", "actor-b"))
        before = self.raw.get(key)
        # The owner's own live lease is the one answer without a new token (docs/guarantees.md#every-exit: how
        # a retried acquire whose reply was lost finds what it created; the store cannot tell that retry from
        # this reuse).
        retried = (
            before is not None and not before.done and before.owner == owner
            and before.expires_in is not None and before.expires_in > 0
        )
        try:
            lease = self.raw.acquire(key, owner, TTL)
        except FenceError as exc:
            self.say(f"actor: acquire {key} as {owner}: {type(exc).__name__}")
            return
        self.say(f"actor: acquire {key} as {owner} -> token {lease.token}")
        if retried:
            assert before is not None
            if lease.token != before.token:
                self.violation(f"{key}: the owner's live lease {before.token} answered as {lease.token}")
            return
        self.rec.acquired.append((key, lease.token, owner))
        if not key.startswith("actor:"):
            return  # the run's key: it keeps running
        if self.chooser.choose("actor then", ("keep", "release")) == "release":
            self.raw.release(lease)
            self.say(f"actor: release {key} token {lease.token}")

    def settle(self) -> None:
        """No more faults: deliver what is queued, run recovery passes, until nothing moves."""
        self.calm, self.down = True, False
        self.say("settle (no more faults)")
        for _ in range(SETTLE_STEPS):
            if self.queue:
                message = min(self.queue, key=lambda m: (m.due, m.serial))
                self.queue.remove(message)
                self.deliver(message)
                continue
            self.sim.move(TTL + GRACE * 64 + 1)
            if not self.recover().resent:
                return
        self.violation(f"never settled: {len(self.queue)} messages left after {SETTLE_STEPS} steps")


class _Scoped:
    """The store as this program's recovery pass sees it: its own keys only (a SQL store serves them all)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def abandoned(self, grace: float, limit: int = 100) -> list[Any]:
        found = self.store.abandoned(grace, 10_000)
        return [a for a in found if f":{self.prefix}" in a.key][:limit]
