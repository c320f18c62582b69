"""A differential state machine: one rule sequence on the memory, SQLite, PostgreSQL and Redis stores in
lockstep, the memory store (the executable spec, itself checked against a model in
tests/unit/test_state_machine.py) as the oracle; the shape of hypothesis's own ``test_database_agreement``.

Every answer must agree with the memory store's: what each call returned or raised (and the exception's
fields), and after every step each key's ``get()``, steps and history (event, token, owner, detail).
Tokens differ per store (each has its own counter, and ``advance`` moves them apart), so a token is
compared by identity and order: the n-th token a store granted is token n, wherever it came from. Leases
expire by the ``expire_all`` rule, which moves each store's stored expiry 10,000 s into the past as the
contract harnesses do (tests/support/harnesses/); nothing sleeps, and the ttls (30 s, 60 s) are too long
for real time to expire a lease within an example. The memory store's clock ticks 1 ms a step, as real time
does on the others.

``FENCE_DIFF_EXAMPLES`` (default 15) and ``FENCE_DIFF_STEPS`` (default 30) size it: a soak sets more.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

from celery_fence import AlreadyDone, FenceError, Lease, LeaseHeld, LeaseState, StaleToken, open_store
from celery_fence.lease import Abandoned, HistoryEvent
from celery_fence.stores.sql import SQLStore

from ..support.harnesses import HARNESSES, Harness
from ..support.harnesses.redis import shift as redis_shift
from ..support.harnesses.sql import _sql_expire, sql_shift

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

EXAMPLES = int(os.environ.get("FENCE_DIFF_EXAMPLES", "15"))
STEPS = int(os.environ.get("FENCE_DIFF_STEPS", "30"))
KEYS = ("a", "b")  # few keys: calls meet on them
OWNERS = ("o1", "o2")
TTLS = (30.0, 60.0)
RUN = {"task": "shop.charge", "id": "t-1", "args": [1], "kwargs": {}}
ADMIN = ("force_release", "strand", "prune", "advance")
VALUES = st.none() | st.integers(-3, 3) | st.text("xy", max_size=2) | st.lists(st.integers(0, 2), max_size=2)


class Tokens:
    """One store's tokens by the order it granted them: the n-th grant is token n on every store."""

    def __init__(self) -> None:
        self.order: dict[int, int] = {0: 0}  # 0: no token yet (a stranded new key)

    def grant(self, token: int) -> int:
        return self.order.setdefault(token, len(self.order))

    def name(self, token: int) -> object:
        return self.order.get(token, ("never granted", token))


def normal(value: Any, tokens: Tokens) -> Any:
    """``value`` with every token replaced by its order, and times by what they mean (live or expired)."""
    if isinstance(value, Lease):
        return ("lease", value.key, tokens.grant(value.token), value.owner, value.taken_over)
    if isinstance(value, LeaseState):
        live = None if value.expires_in is None else value.expires_in > 0
        fields = (value.owner, live, value.done, value.result, value.dead, value.run)
        return ("state", value.key, tokens.name(value.token), *fields, value.recoveries, value.recovery_sent)
    if isinstance(value, HistoryEvent):
        return (value.event, tokens.name(value.token), value.owner, value.detail)
    if isinstance(value, Abandoned):
        return ("abandoned", value.key, tokens.name(value.token), value.run, value.recoveries, value.sent)
    if isinstance(value, list):
        return [normal(item, tokens) for item in value]
    return value


def normal_error(exc: FenceError, tokens: Tokens) -> tuple[Any, ...]:
    if isinstance(exc, StaleToken):
        return ("StaleToken", tokens.name(exc.token), tokens.name(exc.current), exc.what, exc.recorded)
    if isinstance(exc, LeaseHeld):
        return ("LeaseHeld", exc.owner, exc.expires_in is not None and exc.expires_in > 0)
    if isinstance(exc, AlreadyDone):
        return ("AlreadyDone", tokens.name(exc.token), exc.result)
    return (type(exc).__name__,)


def _sqlite(request: pytest.FixtureRequest) -> Iterator[Any]:
    store = open_store(f"sqlite:///{request.getfixturevalue('tmp_path')}/lockstep.db")
    yield store
    store.close()


def _sql_empty(store: Any) -> None:
    """Drop every lease, step and event; the token counter goes on (tokens are compared by order)."""
    with store.engine.begin() as conn:
        for table in ("fence_steps", "fence_history", "fence_leases"):
            conn.execute(text(f"DELETE FROM {table}"))


def _memory_shift(store: Any, seconds: float) -> None:
    store.clock.advance(seconds)


# name, harness, how to empty a store opened once for the test (None: a fresh store per example), and how
# to let ``seconds`` of store time pass for every live lease
STORES: list[tuple[str, Harness, Callable[[Any], None] | None, Callable[[Any, float], None]]] = [
    ("memory", HARNESSES["memory"], None, _memory_shift),  # the oracle: first
    ("sqlite", Harness("sqlite", _sqlite, _sql_expire), _sql_empty, sql_shift),
    ("postgresql", HARNESSES["postgresql"], _sql_empty, sql_shift),
    ("redis", HARNESSES["redis"], None, redis_shift),  # a fresh prefix: cheap
]


class Lockstep:
    """The stores of one test: those with an ``empty`` are opened once and emptied for each example."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.kept = {name: harness.open(request) for name, harness, empty, _ in STORES if empty}
        self.stores = {name: next(opened) for name, opened in self.kept.items()}
        for store in self.stores.values():
            store.migrate()  # the tables exist before the first emptying

    def example(self) -> tuple[list[Any], list[Iterator[Any]]]:
        """Empty stores for one example, and the generators to close after it."""
        fresh = {name: harness.open(self.request) for name, harness, empty, _ in STORES if not empty}
        stores = {name: next(opened) for name, opened in fresh.items()}
        for name, _, empty, _ in STORES:
            if empty:
                empty(self.stores[name])
        return [stores.get(name) or self.stores[name] for name, *_ in STORES], list(fresh.values())

    def close(self) -> None:
        for opened in self.kept.values():
            for _ in opened:
                pass


def advance(store: Any, gap: int) -> None:
    """``advance`` without its floor, which differs per store (tokens are compared by order)."""
    store.advance(gap)


class Disagreement(AssertionError):
    pass


class DifferentialMachine(RuleBasedStateMachine):
    handles = Bundle("handles")  # each a tuple of one Lease per store, in STORES' order
    seen = Bundle("seen")  # each a tuple of one Abandoned per store

    def __init__(self, lockstep: Lockstep) -> None:
        super().__init__()
        self.stores, self.opened = lockstep.example()
        self.tokens = [Tokens() for _ in STORES]

    def teardown(self) -> None:
        for opened in self.opened:
            for _ in opened:  # the harness's cleanup after its yield
                pass

    def each(self, what: str, call: Callable[[int, Any], Any]) -> list[Any] | None:
        """``call(i, store)`` on every store; their answers must agree. The raw answers, or None if all
        raised."""
        self.stores[0].clock.advance(0.001)
        raw, answers = [], []
        for i, store in enumerate(self.stores):
            try:
                value = call(i, store)
            except FenceError as exc:
                raw.append(None)
                answers.append(("raised", normal_error(exc, self.tokens[i])))
            else:
                raw.append(value)
                answers.append(("returned", normal(value, self.tokens[i])))
        self.agree(what, answers)
        return None if answers[0][0] == "raised" else raw

    def agree(self, what: str, answers: list[Any]) -> None:
        for (name, *_), answer in zip(STORES[1:], answers[1:], strict=True):
            if answer != answers[0]:
                raise Disagreement(f"{what}: {name} gave {answer!r}\n  memory gave {answers[0]!r}")

    # -- rules: the unit machine's, with expire_all for its clock, and the other roles' calls --

    @initialize(target=handles, key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS))
    def first_lease(self, key: str, owner: str) -> Any:
        return self.acquire(key, owner, TTLS[0], run=True)

    @rule(target=handles, key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS), ttl=st.sampled_from(TTLS),
          run=st.booleans())
    def acquire(self, key: str, owner: str, ttl: float, run: bool) -> Any:
        record = RUN if run else None
        leases = self.each(f"acquire({key!r}, {owner!r})", lambda i, s: s.acquire(key, owner, ttl, record))
        return multiple() if leases is None else tuple(leases)

    @rule(target=handles, key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS))
    def take_over(self, key: str, owner: str) -> Any:
        """expire_all, then acquire: hypothesis picks the rules with a target least, so a second one."""
        self.expire_all()
        return self.acquire(key, owner, TTLS[0], run=False)

    @rule(chosen=st.lists(handles, min_size=1, max_size=3), ttl=st.sampled_from(TTLS))
    def renew(self, chosen: list[tuple[Lease, ...]], ttl: float) -> None:
        self.each(f"renew({chosen[0][0]}...)", lambda i, s: s.renew([h[i] for h in chosen], ttl))

    @rule(handle=handles, result=VALUES)
    def complete(self, handle: tuple[Lease, ...], result: Any) -> None:
        self.each(f"complete({handle[0]}, {result!r})", lambda i, s: s.complete(handle[i], result))

    @rule(handle=handles)
    def release(self, handle: tuple[Lease, ...]) -> None:
        self.each(f"release({handle[0]})", lambda i, s: s.release(handle[i]))

    @rule(handle=handles, name=st.sampled_from(("s1", "s2")), value=VALUES)
    def save_step(self, handle: tuple[Lease, ...], name: str, value: Any) -> None:
        self.each(f"save_step({handle[0]}, {name!r})", lambda i, s: s.save_step(handle[i], name, value))

    @rule(handle=handles, what=st.sampled_from(("check", "commit")))
    def refuse(self, handle: tuple[Lease, ...], what: str) -> None:
        self.each(f"refuse({handle[0]}, {what!r})", lambda i, s: s.refuse(handle[i], what))

    def holds_a_live_lease(self) -> bool:
        return any((state.expires_in or 0) > 0 for state in self.stores[0].leases())  # the oracle's clock

    @precondition(holds_a_live_lease)  # else a no-op, and hypothesis would pick it most (no arguments)
    @rule()
    def expire_all(self) -> None:
        for (_, harness, _, _), store in zip(STORES, self.stores, strict=True):
            harness.expire_all(store)

    @rule(seconds=st.sampled_from((10, 45)))
    def time_passes(self, seconds: int) -> None:
        """Some leases expire (a 30 s lease after 45 s), others not: ttls and shifts are multiples of 5 s,
        so no lease is within a step's real time of its expiry on any store."""
        for (*_, shift), store in zip(STORES, self.stores, strict=True):
            shift(store, seconds)

    @rule(op=st.sampled_from(ADMIN), key=st.sampled_from(KEYS), run=st.booleans())
    def admin(self, op: str, key: str, run: bool) -> None:
        """One rule for the rarer calls, so that the lease calls above stay most of a program."""
        calls: dict[str, Callable[[int, Any], Any]] = {
            "force_release": lambda i, s: self.tokens[i].grant(s.force_release(key)),
            "strand": lambda i, s: s.strand(key, RUN if run else None, "gave up"),
            "prune": lambda i, s: s.prune(0.0),
            "advance": lambda i, s: advance(s, 1000 if run else 1),
        }
        self.each(f"{op}({key!r})", calls[op])

    @rule(target=seen)
    def abandoned(self) -> Any:
        found = self.each("abandoned(0.0)", lambda i, s: sorted(s.abandoned(0.0), key=lambda a: a.key))
        return multiple(*zip(*found, strict=True)) if found else multiple()

    @rule(seen=seen, bound=st.sampled_from((0, 1, 3)))
    def recover(self, seen: tuple[Abandoned, ...], bound: int) -> None:
        self.each(f"recover({seen[0]}, {bound})", lambda i, s: s.recover(seen[i], bound, reason="lost"))

    # -- after every step: every key reads the same on every store --

    @invariant()
    def every_key_reads_the_same(self) -> None:
        for key in KEYS:
            for call in ("get", "steps", "history"):
                self.agree(f"{call}({key!r})", self.read(lambda s, call=call, key=key: getattr(s, call)(key)))
        self.agree("leases()", self.read(lambda s: sorted(s.leases(), key=lambda state: state.key)))

    def read(self, call: Callable[[Any], Any]) -> list[Any]:
        return [normal(call(store), tokens) for store, tokens in zip(self.stores, self.tokens, strict=True)]


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture
def lockstep(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Lockstep]:
    stores = Lockstep(request)
    yield stores
    stores.close()


def test_every_store_answers_as_the_memory_store(lockstep: Lockstep) -> None:
    run_state_machine_as_test(lambda: DifferentialMachine(lockstep), settings=SETTINGS)


def test_a_store_answering_otherwise_is_caught(lockstep: Lockstep, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine has teeth: a SQLite store whose stale release frees the key anyway (the bug the contract
    forbids) disagrees with the memory store, found without shrinking within a few examples."""
    release = SQLStore.release

    def careless(store: SQLStore, lease: Lease) -> None:
        state = store.get(lease.key) if store.url.startswith("sqlite") else None
        if state is not None and state.expires_in is not None:  # held: by this lease or another
            lease = Lease(lease.key, state.token, state.owner or lease.owner)
        release(store, lease)

    monkeypatch.setattr(SQLStore, "release", careless)
    quick = settings(SETTINGS, max_examples=200, phases=[Phase.generate], database=None, derandomize=True)
    with pytest.raises(Disagreement, match="sqlite gave"):
        run_state_machine_as_test(lambda: DifferentialMachine(lockstep), settings=quick)
