"""``Run`` without Celery: a fake host, the memory store, a fake clock, a renewer with no thread.

Each test drives the real run through one exit and checks the ending it returns as data, the store, and
that every pause went through the runtime's sleep (the fake clock), never real time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from celery_fence import FailedBefore, GaveUp, LeaseHeld, StaleToken, StoreUnavailable
from celery_fence._delivery import Attempt, Ending, Kind
from celery_fence._owed import Released
from celery_fence._runtime import FenceRuntime, Renewer
from celery_fence.fence import Fence
from celery_fence.lease import ENDED_BY, LeaseState
from celery_fence.run import Run
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock, Fault, IndeterminateStore, Outcome

TTL = 30.0


class Host:
    """What a run asks of its task, recorded."""

    def __init__(self, body: Callable[[Any], Any], outcome: str | None = None) -> None:
        self._body, self._outcome = body, outcome
        self.fence: Fence | None = None
        self.bodies = 0
        self.released_fences = 0
        self.reports: list[tuple[str, str]] = []
        self.told: list[tuple[str, int, dict[str, Any]]] = []  # what was reported, with token and fields

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.bodies += 1
        self.called_with = (args, kwargs)
        assert self.fence is not None
        return self._body(self.fence)

    def outcome(self) -> str | None:
        return self._outcome

    def acquired(self, fence: Fence) -> None:
        self.fence = fence

    def released(self, fence: Fence) -> None:
        assert fence is self.fence
        self.fence = None
        self.released_fences += 1

    def report(self, what: str, key: str, token: int, **fields: Any) -> None:
        self.reports.append((what, key))
        self.told.append((what, token, fields))


class World:
    def __init__(self, **conf: Any) -> None:
        self.clock = FakeClock()
        self.memory = MemoryStore(clock=self.clock)
        self.store = IndeterminateStore(self.memory)
        app = SimpleNamespace(conf={"fence_store_url": "memory://", "fence_lease_ttl": TTL, **conf})
        self.runtime = FenceRuntime(app)
        self.runtime._store = self.store  # type: ignore[assignment]
        self.runtime.clock = self.runtime.wall = self.clock
        self.slept: list[float] = []
        self.runtime.sleep = self._sleep
        self.runtime._renewer = Renewer(self.store, TTL / 3, self.clock, background=False)  # type: ignore[arg-type]

    def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)

    def run(self, host: Host, task_id: str = "t-1", args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None, **attempt: Any) -> Ending:
        run = Run(host, self.runtime, self.runtime.config, "k", {"id": task_id}, Attempt(task_id, **attempt))
        return run.execute(args, kwargs or {})


@pytest.fixture
def world() -> World:
    return World()


def test_a_returned_body_completes(world: World) -> None:
    ending = world.run(Host(lambda fence: "v"))
    assert ending == Ending.returning("v")
    state = world.memory.get("k")
    assert state is not None and state.done and state.result == "v"


def test_a_raising_body_is_released_and_its_exception_raised(world: World) -> None:
    error = ValueError("no")
    ending = world.run(Host(lambda fence: (_ for _ in ()).throw(error)))
    assert ending.kind is Kind.RAISE and ending.error is error
    state = world.memory.get("k")
    assert state is not None and state.expires_in is None and not state.done


def test_a_failed_runs_lost_release_is_owed(world: World) -> None:
    world.store.faults = [Fault(Outcome.BEFORE, method="release", rate=1.0)]
    ending = world.run(Host(lambda fence: 1 / 0))
    assert ending.kind is Kind.RAISE and isinstance(ending.error, ZeroDivisionError)
    assert len(world.runtime.owed) == 1
    owed = world.runtime.owed._pop()
    assert isinstance(owed, Released) and owed.task_id == "t-1" and owed.lease.token == 1


def test_a_time_limit_while_the_completions_reply_is_due_returns_the_stored_result(world: World) -> None:
    world.store.faults = [Fault(Outcome.INTERRUPTED, method="complete")]
    assert world.run(Host(lambda fence: "v")) == Ending.returning("v")


def test_a_time_limit_before_the_completion_acted_is_the_runs_failure(world: World) -> None:
    class Interrupting(IndeterminateStore):
        def complete(self, lease: Any, result: Any) -> None:
            raise SoftTimeLimitExceeded("before it acted")

    world.runtime._store = Interrupting(world.memory)  # type: ignore[assignment]
    ending = world.run(Host(lambda fence: "v"))
    assert ending.kind is Kind.RAISE and isinstance(ending.error, SoftTimeLimitExceeded)
    state = world.memory.get("k")
    assert state is not None and not state.done and state.expires_in is None  # released


def test_an_operators_release_sends_the_run_again_with_its_lease_handed_back(world: World) -> None:
    def body(fence: Fence) -> str:
        world.memory.force_release("k")
        return "late"

    ending = world.run(Host(body), retries=3)
    assert ending.kind is Kind.SEND_AGAIN and ending.headers == {"fence_resends": 1}
    assert ending.hand_back is not None and ending.error is None
    assert ending.countdown == 0.0  # the first re-send goes at once


def test_the_fences_resends_are_bounded_and_giving_up_leaves_a_record(world: World) -> None:
    def body(fence: Fence) -> str:
        world.memory.force_release("k")
        return "late"

    ending = world.run(Host(body), resends=20)
    assert ending.kind is Kind.RAISE and isinstance(ending.error, GaveUp) and ending.error.key == "k"
    assert ending.record is not None and "gave up after 20 re-sends" in ending.record.reason


def test_a_busy_key_is_polled_sooner_than_the_holders_ttl_then_given_up(world: World) -> None:
    world.memory.acquire("k", "someone-else", TTL)
    host = Host(lambda fence: "never")
    ending = world.run(host)
    assert ending.kind is Kind.SEND_AGAIN and isinstance(ending.error, LeaseHeld)
    assert ending.headers["fence_looks"] == 1 and ending.countdown == TTL / 3
    late = world.run(host, busy_since=world.clock() - 3600.0)
    assert late.kind is Kind.RAISE and isinstance(late.error, LeaseHeld)
    assert host.bodies == 0


def test_an_outage_at_acquire_is_waited_out_then_given_up_with_a_record(world: World) -> None:
    world.store.faults = [Fault(Outcome.BEFORE, method="acquire", rate=1.0)]
    ending = world.run(Host(lambda fence: "never"))
    assert ending.kind is Kind.SEND_AGAIN and ending.headers["fence_waits"] == 1
    assert world.slept and sum(world.slept) < TTL  # the acquire's own retries, on the fake clock
    late = world.run(Host(lambda fence: "never"), waiting_since=world.clock() - 601.0, waits=5)
    assert late.kind is Kind.RAISE and isinstance(late.error, StoreUnavailable) and late.record is not None
    assert "gave up waiting out the unavailable store (" in late.record.reason
    assert late.record.reason.endswith("s, fence_store_wait 600s)")


def test_a_copy_of_a_task_id_that_ended_failure_is_not_run(world: World) -> None:
    world.memory.acquire("k", "the-failed-run", TTL, {"id": "t-1"})
    world.clock.advance(TTL + 1)  # its release was lost: the lease expired
    host = Host(lambda fence: "again", outcome="FAILURE")
    assert world.run(host).kind is Kind.IGNORE
    assert host.bodies == 0
    state = world.memory.get("k")
    assert state is not None and state.expires_in is None and not state.done


@pytest.mark.parametrize("ended", ["FAILURE", "SUCCESS", "REVOKED"])
def test_a_late_copy_of_an_ended_task_id_leaves_its_ending_alone(world: World, ended: str) -> None:
    """Not marked as a copy (a duplicate the broker sent twice), it meets a busy key or a dead store: the
    ending that would store RETRY or FAILURE over the task id's is not produced (the simulation's N6)."""
    world.memory.acquire("k", "another-task-id", TTL, {"id": "t-2"})
    host = Host(lambda fence: "never", outcome=ended)
    busy = world.run(host)
    assert busy.kind is Kind.IGNORE and busy.error is None and busy.failure is None
    world.store.faults = [Fault(Outcome.BEFORE, method="acquire", rate=1.0)]
    late = world.run(host, waiting_since=world.clock() - 601.0, waits=5)
    assert late.kind is Kind.IGNORE and late.error is None and late.record is None
    assert host.bodies == 0 and host.reports.count(("duplicate", "k")) == 2
    assert [(token, fields["reason"]) for what, token, fields in host.told] == [(0, "ended")] * 2


def test_an_unknown_completion_whose_reads_fail_is_sent_again_once_its_deadline_passed(world: World) -> None:
    """The completion's reply is lost and no read answers: the run reads until the lease's deadline, not for
    ever, then hands the run to a copy (it may have committed: never FAILURE)."""
    reads: list[float] = []

    class Unreadable(IndeterminateStore):
        def get(self, key: str) -> Any:
            reads.append(world.clock())
            assert len(reads) < 1000, "the run kept reading past its deadline"
            raise StoreUnavailable("sim: the read is lost")

    def body(fence: Fence) -> str:
        world.clock.advance(TTL / 2)  # a long body, not renewed (no renewer thread here)
        return "v"

    world.runtime._store = Unreadable(world.memory, faults=[Fault(Outcome.LOST, method="complete")])  # type: ignore[assignment]
    started = world.clock()
    ending = world.run(Host(body))
    assert ending.kind is Kind.SEND_AGAIN and ending.headers == {"fence_resends": 1}
    assert ending.countdown == TTL / 3  # a renew interval: the copy comes once the store may answer again
    # Read until the lease's own deadline (its acquire plus the ttl), not a ttl after the completion.
    assert reads and started + TTL / 2 <= reads[0] and reads[-1] <= started + TTL


def test_a_fenced_write_of_unknown_outcome_sends_the_run_again_after_a_renew_interval(world: World) -> None:
    """The body's own fenced write did not answer: a copy runs it again (the write is token-checked), not at
    once but after a renew interval, the lease handed to it."""

    def body(fence: Fence) -> None:
        raise StoreUnavailable("sim: the fenced write's reply is lost")

    ending = world.run(Host(body))
    assert ending.kind is Kind.SEND_AGAIN and ending.headers == {"fence_resends": 1}
    assert ending.countdown == TTL / 3 and ending.hand_back is not None and ending.error is None


def test_with_fence_interrupt_a_lost_lease_interrupts_the_body() -> None:
    """``fence_interrupt``: the renewer's lost lease interrupts the body where it stands (here the main
    thread, by a signal); the run ends as a refusal, the rest of the body never runs."""
    world = World(fence_interrupt=True)
    went_on: list[str] = []

    def body(fence: Fence) -> str:
        lose = threading.Thread(target=world.runtime.renewer._lose, args=(fence.lease, "renew refused"))
        lose.start()  # from another thread, as the renewer's own
        lose.join()
        for _ in range(10_000):  # the handler runs at a bytecode boundary of this thread
            pass
        went_on.append("the body went on")
        return "late"

    host = Host(body)
    ending = world.run(host)
    assert went_on == [] and ending.kind is not Kind.RETURN
    assert [what for what, _, _ in host.told] == ["lost", "refused"]
    assert world.runtime.interrupter._armed == {}  # disarmed as the run left its body


def test_the_renewers_renewals_are_reported_to_the_host(world: World) -> None:
    def body(fence: Fence) -> str:
        world.clock.advance(TTL / 3 + 1)
        world.runtime.renewer.tick()
        return "v"

    host = Host(body)
    assert world.run(host) == Ending.returning("v")
    assert [(what, token) for what, token, _ in host.told] == [("renewed", 1)]
    assert host.reports == [("renewed", "k")]


def test_an_eager_runs_fenced_write_of_unknown_outcome_raises_to_its_caller(world: World) -> None:
    unknown = StoreUnavailable("sim: the fenced write's reply is lost")

    def body(fence: Fence) -> None:
        raise unknown

    ending = world.run(Host(body), eager=True)
    assert ending.kind is Kind.RAISE and ending.error is unknown


@pytest.mark.parametrize("copy_done", [True, False])
def test_a_stale_runs_failure_leaves_the_ending_to_the_copy_of_its_task_id(
    world: World, copy_done: bool
) -> None:
    """A copy of this very task id took the key over (and finished it, or runs it still); then this stale
    run's body raises. A FAILURE now would fire the errback beside the copy's link: it is absorbed."""

    def body(fence: Fence) -> None:
        world.clock.advance(TTL + 1)
        copy = world.memory.acquire("k", "the-copy", TTL, {"id": "t-1"})
        if copy_done:
            world.memory.complete(copy, "the copy's result")
        raise ValueError("the stale run's body failed")

    ending = world.run(Host(body))
    assert ending.kind is Kind.IGNORE and ending.failure is None


def test_a_failure_whose_key_another_task_id_took_is_still_this_task_ids_failure(world: World) -> None:
    def body(fence: Fence) -> None:
        world.clock.advance(TTL + 1)
        world.memory.acquire("k", "another-task-id", TTL, {"id": "t-2"})
        raise ValueError("failed")

    ending = world.run(Host(body))
    assert ending.kind is Kind.RAISE and isinstance(ending.error, ValueError)


def test_an_acquire_that_fails_twice_is_tried_a_third_time(world: World) -> None:
    world.store.faults = [Fault(Outcome.BEFORE, method="acquire", nth=n) for n in (1, 2)]
    assert world.run(Host(lambda fence: "v")) == Ending.returning("v")
    pause = world.runtime.config.policy.acquire_pause
    assert world.slept == [pause, 2 * pause]  # a longer pause after each failed call


def test_what_the_store_raises_outside_its_errors_reaches_the_caller_unchanged(world: World) -> None:
    class Broken(IndeterminateStore):
        def acquire(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug in a store")

    world.runtime._store = Broken(world.memory)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="a bug in a store"):
        world.run(Host(lambda fence: "v"))


def _unknown_completion(world: World) -> None:
    world.store.faults = [
        Fault(Outcome.LOST, method="complete"), Fault(Outcome.BEFORE, method="get", rate=1.0)
    ]


def test_an_eager_completion_of_unknown_outcome_raises_store_unavailable_not_the_cause(world: World) -> None:
    _unknown_completion(world)
    ending = world.run(Host(lambda fence: "v"), eager=True)
    assert ending.kind is Kind.RAISE and isinstance(ending.error, StoreUnavailable)
    assert "may have committed" in str(ending.error)


def test_a_completion_of_unknown_outcome_at_the_last_resend_is_never_failure(world: World) -> None:
    _unknown_completion(world)
    ending = world.run(Host(lambda fence: "v"), resends=20)
    assert ending.kind is Kind.IGNORE and ending.record is not None
    assert "gave up after 20 re-sends by the fence (completion)" in ending.record.reason


class InterruptedOnRelease(Host):
    """A time limit lands in the run's last step, once its ending is decided."""

    def released(self, fence: Fence) -> None:
        super().released(fence)
        raise SoftTimeLimitExceeded("on the way out")


@pytest.mark.parametrize("reply", ["lost", "late"])
def test_a_time_limit_in_the_last_step_leaves_the_decided_ending_standing(world: World, reply: str) -> None:
    """The completion's reply was lost: read back done, the run returns the stored result; with the read
    failing past the deadline, it sends a copy. A time limit in the last step changes neither (the
    simulation's N7 and N8: both ended FAILURE, and the copy was never sent)."""
    world.store.faults = [Fault(Outcome.LOST, method="complete")]
    if reply == "late":  # no read answers: the outcome stays unknown
        world.store.faults.append(Fault(Outcome.BEFORE, method="get", rate=1.0))
    ending = world.run(InterruptedOnRelease(lambda fence: "v"))
    if reply == "lost":
        assert ending == Ending.returning("v")
    else:
        assert ending.kind is Kind.SEND_AGAIN and ending.hand_back is not None


def _taken_over(world: World) -> None:
    """The run's lease expires and another owner takes the key (token 2)."""
    world.clock.advance(TTL + 1)
    world.memory.acquire("k", "the-new-owner", TTL, {"id": "t-2"})


def test_a_refusal_by_the_resource_itself_is_written_to_the_history_once(world: World) -> None:
    """``fenced_update`` refuses in the user's own table (the store never saw it): the run writes it to the
    key's history, naming what was refused, and reports it with its token; the new owner's live lease makes
    the run end ``LeaseHeld`` naming how long that lease still runs."""

    def body(fence: Fence) -> None:
        _taken_over(world)
        raise StaleToken("k", fence.token, 2, "update of fence_accounts")

    host = Host(body)
    ending = world.run(host)
    assert ending.kind is Kind.RAISE and isinstance(ending.error, LeaseHeld)
    assert ending.error.key == "k" and ending.error.expires_in == TTL and "t-2" in str(ending.error.owner)
    refused = [e for e in world.memory.history("k") if e.event == "refused"]
    assert [(e.token, e.detail) for e in refused] == [(1, "update of fence_accounts")]
    assert [(what, token) for what, token, _ in host.told] == [("refused", 1)]
    assert "update of fence_accounts refused" in host.told[0][2]["reason"]


def test_a_refusal_the_store_recorded_is_not_written_twice(world: World) -> None:
    def body(fence: Fence) -> None:
        _taken_over(world)
        raise StaleToken("k", fence.token, 2, "step send", recorded=True)

    world.run(Host(body))
    assert [e for e in world.memory.history("k") if e.event == "refused"] == []


def test_a_refusal_nobody_took_over_is_sent_again_then_given_up_naming_why(world: World) -> None:
    def body(fence: Fence) -> None:
        world.memory.force_release("k")  # an operator's release: nobody holds the key
        raise StaleToken("k", fence.token, None, "step send")

    ending = world.run(Host(body), resends=20)
    assert ending.kind is Kind.RAISE and isinstance(ending.error, GaveUp)
    assert "step send refused" in str(ending.error)


def test_an_eager_refusal_nobody_took_over_raises_the_refusal_to_its_caller(world: World) -> None:
    """``apply()`` has no queue to send the run to again: its caller gets the refusal itself."""
    refusal = StaleToken("k", 1, None, "step send")

    def body(fence: Fence) -> None:
        world.memory.force_release("k")
        raise refusal

    ending = world.run(Host(body), eager=True)
    assert ending.kind is Kind.RAISE and ending.error is refusal


def test_a_refusal_whose_key_cannot_be_read_is_sent_again_at_once(world: World) -> None:
    """Refused, and the read that would say by whom fails: a copy finds out, sent at once, the lease
    handed to it, without reporting a refusal nobody could confirm."""

    def body(fence: Fence) -> None:
        world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
        raise StaleToken("k", fence.token, None, "step send")

    host = Host(body)
    ending = world.run(host)
    assert ending.kind is Kind.SEND_AGAIN and ending.countdown == 0.0 and ending.hand_back is not None
    assert ending.headers == {"fence_resends": 1} and host.reports == []


def test_a_step_does_not_start_once_the_lease_is_known_lost(world: World) -> None:
    called: list[str] = []

    def body(fence: Fence) -> Any:
        fence.mark_lost("the renewer said so")
        return fence.step("send", lambda: called.append("sent"))

    host = Host(body)
    ending = world.run(host)
    assert called == []
    assert ending.kind is Kind.SEND_AGAIN  # refused, nobody took over: sent again
    assert ("refused", "k") in host.reports


def test_the_renewer_reports_a_lost_lease_to_the_host(world: World) -> None:
    def body(fence: Fence) -> Any:
        world.memory.force_release("k")
        world.clock.advance(TTL / 3)
        world.runtime.renewer.tick()  # the renew is refused: the host hears of it at once
        fence.check()

    host = Host(body)
    ending = world.run(host)
    assert host.reports == [("lost", "k"), ("refused", "k")]
    assert ending.kind is Kind.SEND_AGAIN


def test_a_key_that_keeps_changing_under_the_run_is_acquired_five_rounds_then_busy(world: World) -> None:
    """Each acquire meets a lease that is gone by the time the run reads the key (released, finished or
    pruned in between): the run acquires again, five rounds, pausing a little longer each time, then treats
    the key as busy without naming a holder it never saw."""
    acquires: list[float] = []

    class Changing(IndeterminateStore):
        def acquire(self, key: str, *args: Any, **kwargs: Any) -> Any:
            acquires.append(world.clock())
            raise LeaseHeld(key, "a run that is gone by the read", TTL)

        def get(self, key: str) -> Any:
            return None

    world.runtime._store = Changing(world.memory)  # type: ignore[assignment]
    host = Host(lambda fence: "never")
    ending = world.run(host)
    assert len(acquires) == 5 and host.bodies == 0
    assert world.slept == pytest.approx([0.05, 0.10, 0.15, 0.20, 0.25])
    assert ending.kind is Kind.SEND_AGAIN and isinstance(ending.error, LeaseHeld)
    assert ending.error.key == "k" and ending.error.owner is None


def test_a_step_past_the_leases_local_deadline_is_refused_on_the_runs_clock(world: World) -> None:
    """No renew got through for a ttl (the run's clock says so, not the wall's): the next step is refused
    before the store sees it, and the run, refused with nobody holding the key, is sent again."""
    called: list[str] = []

    def body(fence: Fence) -> Any:
        world.clock.advance(TTL + 1)  # the renewer never ran: the local deadline passed
        return fence.step("send", lambda: called.append("sent"))

    host = Host(body)
    ending = world.run(host)
    assert called == [] and ending.kind is Kind.SEND_AGAIN
    assert [what for what, _, _ in host.told] == ["refused"]
    assert "local deadline" in host.told[0][2]["reason"]


@pytest.mark.parametrize("exit_", ["returned", "raised", "refused", "interrupted"])
def test_every_exit_lets_go_of_the_fence(world: World, exit_: str) -> None:
    """Whatever the body did, and even when a time limit lands in the last step, the renewer stops renewing
    the run's lease and the host hears, once, that the fence is let go."""

    def body(fence: Fence) -> str:
        if exit_ == "raised":
            raise ValueError("no")
        if exit_ == "refused":
            world.memory.force_release("k")
            fence.check()
        return "v"

    host = InterruptedOnRelease(body) if exit_ == "interrupted" else Host(body)
    world.run(host)
    assert host.released_fences == 1 and host.fence is None
    assert world.runtime.renewer._leases == {}


def test_a_system_exit_in_the_completion_goes_on_up_once_the_fence_is_let_go(world: World) -> None:
    """The process is going (SystemExit while the completion's reply is due): the run raises it as it is,
    having stopped renewing and let its fence go; the store tells the rest to whoever comes next."""

    class Exiting(IndeterminateStore):
        def complete(self, lease: Any, result: Any) -> None:
            raise SystemExit(1)

    world.runtime._store = Exiting(world.memory)  # type: ignore[assignment]
    host = Host(lambda fence: "v")
    with pytest.raises(SystemExit):
        world.run(host)
    assert host.released_fences == 1 and world.runtime.renewer._leases == {}


@pytest.mark.parametrize("interrupt", [False, True])
def test_the_body_gets_the_tasks_arguments(interrupt: bool) -> None:
    world = World(fence_interrupt=interrupt)
    host = Host(lambda fence: "v")
    assert world.run(host, args=(1, 2), kwargs={"x": 3}) == Ending.returning("v")
    assert host.called_with == ((1, 2), {"x": 3})


def test_a_run_whose_transaction_was_lost_with_earlier_blocks_is_sent_again_after_a_renew_interval(
    world: World,
) -> None:
    """The body caught the failure of a second ``transaction()`` block whose connection was lost: the
    earlier blocks' writes went with it, so completing would commit half a run. Nothing is completed; a copy
    runs it whole, after a renew interval, the lease handed to it (a SQL store's run transaction; here its
    state alone, as the SQL store leaves it)."""

    def body(fence: Fence) -> str:
        fence._run_tx = SimpleNamespace(open=False, lost_work=True, close=lambda: None)
        return "half"

    ending = world.run(Host(body))
    assert ending.kind is Kind.SEND_AGAIN and ending.countdown == TTL / 3 and ending.hand_back is not None
    state = world.memory.get("k")
    assert state is not None and not state.done
    eager = World().run(Host(body), eager=True)  # apply(): its caller is told why
    assert isinstance(eager.error, StoreUnavailable) and "lost with earlier writes" in str(eager.error)


def test_a_completion_the_store_refuses_while_the_key_is_still_the_runs_is_a_refusal(world: World) -> None:
    """The store refuses the completion (StaleToken: it did not act, e.g. it judged the lease expired) and
    the key still shows the run's token: a refusal, reported and sent again once, not an unknown outcome
    that would call the completion again."""
    completes: list[int] = []

    class Refusing(IndeterminateStore):
        def complete(self, lease: Any, result: Any) -> None:
            completes.append(lease.token)
            raise StaleToken(lease.key, lease.token, None, "complete")

    world.runtime._store = Refusing(world.memory)  # type: ignore[assignment]
    host = Host(lambda fence: "v")
    ending = world.run(host)
    assert ending.kind is Kind.SEND_AGAIN and ending.countdown == 0.0 and completes == [1]
    assert [what for what, _, _ in host.told] == ["refused"]


def test_an_interrupt_after_the_completion_answered_still_returns_the_result(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time limit lands as the run returns from its completed attempt (a signal handler's exception lands
    at any bytecode): the completion committed, so the run returns its result, having let go of its fence."""
    attempt = Run._attempt

    def interrupted(self: Run, *args: Any) -> Ending:
        attempt(self, *args)
        raise SoftTimeLimitExceeded("right after the completion answered")

    monkeypatch.setattr(Run, "_attempt", interrupted)
    host = Host(lambda fence: "v")
    assert world.run(host) == Ending.returning("v")
    state = world.memory.get("k")
    assert state is not None and state.done and host.released_fences == 1


class Counting(Host):
    """A host that counts how often the run asks the result backend."""

    asked = 0

    def outcome(self) -> str | None:
        self.asked += 1
        return super().outcome()


def test_the_result_backend_is_asked_only_on_the_slow_paths() -> None:
    """A run that returns, fails on its own key, or is refused by a run of another task id that still holds
    the key never reads the result backend (docs/guarantees.md#every-exit: only copies, takeovers and finished
    keys do)."""

    def refused(world: World) -> Callable[[Fence], Any]:
        def body(fence: Fence) -> None:
            _taken_over(world)
            fence.check()

        return body

    bodies: dict[str, Callable[[World], Callable[[Fence], Any]]] = {
        "returned": lambda world: lambda fence: "v",
        "raised": lambda world: lambda fence: 1 / 0,
        "superseded": refused,
    }
    for what, body in bodies.items():
        world = World()
        host = Counting(body(world))
        ending = world.run(host)
        assert ending.kind is (Kind.RETURN if what == "returned" else Kind.RAISE), what
        assert host.asked == 0, what


@pytest.mark.parametrize("ended", [True, False])
def test_a_failure_whose_key_cannot_be_read_asks_the_backend_whether_its_task_id_ended(
    world: World, ended: str
) -> None:
    """The body raised and the read that would say who has the key fails: if the result backend holds this
    task id's ending (a copy of it delivered), the failure is absorbed; else a copy is sent to find out
    whether a copy of it committed (the simulation's N11), never a FAILURE that could come beside it."""

    def body(fence: Fence) -> None:
        world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
        raise ValueError("failed")

    ending = world.run(Host(body, outcome="SUCCESS" if ended else "STARTED"))
    if ended:
        assert ending.kind is Kind.IGNORE and ending.error is None
    else:
        assert ending.kind is Kind.SEND_AGAIN and ending.hand_back is not None and ending.failure is None


@pytest.mark.parametrize("ended", [True, False])
def test_a_finished_key_that_cannot_be_read_asks_the_backend_whether_its_task_id_ended(
    world: World, ended: str
) -> None:
    """The acquire says the key is done and the read fails: a task id whose ending is stored ends quietly
    (its link fired once already); else the run returns what the acquire said the key stored."""
    lease = world.memory.acquire("k", "the-first-run", TTL, {"id": "t-1"})
    world.memory.complete(lease, "stored")
    world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
    host = Host(lambda fence: "never", outcome="SUCCESS" if ended else None)
    ending = world.run(host)
    assert host.bodies == 0
    assert ending == (Ending.ignoring() if ended else Ending.returning("stored"))
    # Reported as a duplicate of a done key; the token is the acquire's (AlreadyDone) or, unread, 0.
    assert [(what, token, fields) for what, token, fields in host.told] == [
        ("duplicate", 0 if ended else lease.token, {"reason": "done"})
    ]


@pytest.mark.parametrize("then", ["pruned", "taken by another task id"])
def test_a_stale_runs_failure_after_its_copy_delivered_and_the_key_moved_on_is_absorbed(
    world: World, then: str
) -> None:
    """A copy of this task id took the lapsed key over, finished it and stored SUCCESS (its link fired); the
    key was then pruned, or pruned and taken by another task id. The stale run's body now raises: the key
    no longer names the copy, but the result backend holds this task id's ending, and a FAILURE over it
    would fire the errback after the link."""

    def body(fence: Fence) -> None:
        world.clock.advance(TTL + 1)
        copy = world.memory.acquire("k", "the-copy", TTL, {"id": "t-1"})
        world.memory.complete(copy, "the copy's result")
        world.memory.prune(older_than=0.0)
        if then != "pruned":
            world.memory.acquire("k", "another-task-id", TTL, {"id": "t-2"})
        raise ValueError("the stale run's body failed")

    host = Counting(body, outcome="SUCCESS")
    ending = world.run(host)
    assert ending.kind is Kind.IGNORE and ending.failure is None and host.asked == 1


def test_a_copy_of_a_finished_run_not_delivered_yet_waits_once_then_delivers_for_it(world: World) -> None:
    """The key is done by another run of this task id, whose SUCCESS the backend does not hold yet (it may be
    storing it now): the copy looks again after a ttl, naming the token it waited for; if that token still
    has not delivered, the copy delivers its result."""
    lease = world.memory.acquire("k", "the-run-that-committed", TTL, {"id": "t-1"})
    world.memory.complete(lease, "stored")
    host = Host(lambda fence: "never", outcome="STARTED")
    first = world.run(host)
    assert first.kind is Kind.SEND_AGAIN and first.headers.get("fence_awaited") == lease.token
    assert first.countdown == TTL
    assert world.run(host, awaited_token=lease.token) == Ending.returning("stored")
    assert host.bodies == 0


@pytest.mark.parametrize("lost", ["lapsed", "released by an operator"])
def test_a_stale_failure_whose_key_cannot_be_read_is_sent_again_not_failed(world: World, lost: str) -> None:
    """The body raised after its lease lapsed, or after an operator released it (the run not told yet): a copy
    of this task id may have taken the key over and committed, and the key cannot be read. A FAILURE now
    could come beside that copy's SUCCESS, so a copy is sent to find out (it delivers the stored result, or
    takes the key back and runs). The simulation's N11, both ways."""

    def body(fence: Fence) -> None:
        if lost == "lapsed":
            world.clock.advance(TTL + 1)  # no renew got through
        else:
            world.memory.force_release("k")
        world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
        raise ValueError("the stale run's body failed")

    ending = world.run(Host(body))
    assert ending.kind is Kind.SEND_AGAIN and ending.hand_back is not None and ending.failure is None


def test_with_fence_on_busy_fail_a_worker_fails_at_once_on_a_held_key() -> None:
    world = World(fence_on_busy="fail")
    world.memory.acquire("k", "someone-else", TTL, {"id": "t-2"})
    host = Host(lambda fence: "never")
    ending = world.run(host)
    assert ending.kind is Kind.RAISE and isinstance(ending.error, LeaseHeld) and host.bodies == 0


def test_a_duplicate_of_a_running_task_id_is_reported_and_looks_again_later(world: World) -> None:
    world.memory.acquire("k", "the-running-copy", TTL, {"id": "t-1"})
    host = Host(lambda fence: "never")
    ending = world.run(host)
    assert ending.kind is Kind.SEND_AGAIN and ending.headers == {"fence_looks": 1} and host.bodies == 0
    assert host.reports == [("duplicate", "k")]
    assert [(token, fields) for _, token, fields in host.told] == [(0, {"reason": "held"})]


def test_a_duplicate_of_a_finished_key_reports_the_token_that_finished_it(world: World) -> None:
    first = world.memory.acquire("k", "the-first-run", TTL, {"id": "t-2"})
    world.memory.complete(first, "stored")
    host = Host(lambda fence: "never")
    assert world.run(host) == Ending.returning("stored")
    state = world.memory.get("k")
    assert state is not None
    assert [(what, token, fields) for what, token, fields in host.told] == [
        ("duplicate", state.token, {"reason": "done"})
    ]


def test_a_completion_that_failed_before_the_store_acted_is_called_again(world: World) -> None:
    """The completion did not answer and a read shows the key still the run's, not done: outside a
    transaction the token is still ours, so the run completes again rather than sending a copy."""
    world.store.faults = [Fault(Outcome.BEFORE, method="complete", nth=1)]
    assert world.run(Host(lambda fence: "v")) == Ending.returning("v")
    state = world.memory.get("k")
    assert state is not None and state.done and state.result == "v"


@pytest.mark.parametrize("exc", [Retry(), Reject("no", requeue=False), Ignore()])
def test_the_bodys_own_celery_endings_release_without_reading_the_key(world: World, exc: Exception) -> None:
    """``self.retry()``, ``Reject`` and ``Ignore`` take Celery's course at once: the lease is released and
    the exception raised, with no read of the key (only a failure asks who has it)."""
    reads: list[str] = []

    class CountingReads(IndeterminateStore):
        def get(self, key: str) -> Any:
            reads.append(key)
            return super().get(key)

    world.runtime._store = CountingReads(world.memory)  # type: ignore[assignment]

    def body(fence: Fence) -> None:
        raise exc

    ending = world.run(Host(body))
    assert ending.kind is Kind.RAISE and ending.error is exc and reads == []
    state = world.memory.get("k")
    assert state is not None and state.expires_in is None


def test_an_unknown_completion_after_the_renewer_gave_up_the_lease_reads_for_a_ttl(world: World) -> None:
    """The renewer found the lease lost and stopped tracking it (no deadline of its own any more); the
    completion's reply is lost and no read answers: the run reads for a ttl from the completion, then sends
    a copy, rather than giving up at the first failed read."""
    reads: list[float] = []

    class Unreadable(IndeterminateStore):
        def get(self, key: str) -> Any:
            reads.append(world.clock())
            raise StoreUnavailable("sim: the read is lost")

    def body(fence: Fence) -> str:
        world.memory.force_release("k")
        world.clock.advance(TTL / 3)
        world.runtime.renewer.tick()  # the renew is refused: lost, untracked
        return "late"

    world.runtime._store = Unreadable(world.memory, faults=[Fault(Outcome.LOST, method="complete")])  # type: ignore[assignment]
    ending = world.run(Host(body))
    assert ending.kind is Kind.SEND_AGAIN
    assert len(reads) > 1 and reads[-1] - reads[0] <= TTL


# -- fence_mode="commit" (docs/commit-mode.md): one ending per task id, the FAILURE's mark --


def _mark(world: World, by: str, reason: str = "w[t-1] ended FAILURE (ValueError)") -> None:
    """A run of task t-1 (owner ``by``) ended FAILURE and marked the key, as ``Run._marks`` does."""
    assert world.memory.strand("k", {"id": "t-1", ENDED_BY: by}, reason) is True


def _raises(error: BaseException) -> Callable[[Any], Any]:
    def body(fence: Any) -> Any:
        raise error

    return body


def test_a_failed_commit_mode_run_marks_its_key_with_its_owner_then_ends_failure() -> None:
    world, error = World(fence_mode="commit"), ValueError("no")
    ending = world.run(Host(_raises(error)))
    assert ending.kind is Kind.RAISE and ending.error is error
    state = world.memory.get("k")
    assert state is not None and not state.done and state.expires_in is None
    assert state.dead == "[t-1] ended FAILURE (ValueError)" and (state.run or {}).get("id") == "t-1"
    assert (state.run or {}).get(ENDED_BY)  # its owner: a lost reply of the mark is read back as its own
    assert [(e.event, e.detail) for e in world.memory.history("k")] == [("gave-up", state.dead)]


def test_a_commit_mode_failure_whose_marks_reply_is_lost_reads_the_mark_as_its_own_and_fails() -> None:
    world, error = World(fence_mode="commit"), ValueError("no")
    world.store.faults = [Fault(Outcome.LOST, method="strand")]
    ending = world.run(Host(_raises(error)))
    assert ending.kind is Kind.RAISE and ending.error is error
    assert (world.memory.get("k") or LeaseState("k", 0, None, None, False)).dead


def test_a_copy_that_meets_its_task_ids_failure_mark_waits_a_ttl_then_ends_with_that_failure() -> None:
    """The run that marked the key may still be storing its FAILURE: the copy looks again after a ttl
    (``fence_awaited`` 0: the key never had a token), then ends FAILURE with ``FailedBefore`` naming the
    mark's reason, and never runs the body."""
    world = World(fence_mode="commit")
    _mark(world, by="the-run-that-failed")
    host = Host(lambda fence: "never", outcome="STARTED")
    first = world.run(host)
    assert first.kind is Kind.SEND_AGAIN and first.headers == {"fence_awaited": 0} and first.countdown == TTL
    second = world.run(host, awaited_token=0)
    assert second.kind is Kind.RAISE and isinstance(second.error, FailedBefore)
    assert (second.error.key, second.error.token) == ("k", 0)
    assert second.error.reason == "w[t-1] ended FAILURE (ValueError)"
    assert host.told == [("duplicate", 0, {"reason": "failed"})] and host.reports == [("duplicate", "k")]
    assert host.bodies == 0


def test_a_copy_meeting_the_mark_on_a_key_it_cannot_read_waits_with_the_marks_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The mark pins the token the key had (an earlier lease's): the store's ``FailedBefore`` carries it, so
    the copy's wait names it even when the read after it fails."""
    world = World(fence_mode="commit")
    world.memory.release(world.memory.acquire("k", "an-earlier-lease", TTL, {"id": "t-0"}))
    _mark(world, by="the-run-that-failed")
    world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
    host = Host(lambda fence: "never", outcome="STARTED")
    with caplog.at_level(logging.INFO, logger="celery_fence"):
        first = world.run(host)
    assert first.kind is Kind.SEND_AGAIN and first.headers == {"fence_awaited": 1} and host.bodies == 0
    assert "finds k marked failed, not delivered yet: looks again in 30.0s" in caplog.text


def test_a_marked_failure_ends_failure_without_reading_the_key() -> None:
    """Its own mark says the FAILURE is the task id's ending: no read, so a store whose reads fail cannot
    turn it into a resend."""
    world, error = World(fence_mode="commit"), ValueError("no")
    world.store.faults = [Fault(Outcome.BEFORE, method="get", rate=1.0)]
    ending = world.run(Host(_raises(error)))
    assert ending.kind is Kind.RAISE and ending.error is error


@pytest.mark.parametrize(("outcome", "kind"), [("FAILURE", Kind.IGNORE), (None, Kind.RAISE)])
def test_a_copy_meeting_the_mark_ends_quietly_once_the_failure_is_stored_and_at_once_when_nothing_tells(
    outcome: str | None, kind: Kind
) -> None:
    world = World(fence_mode="commit")
    _mark(world, by="the-run-that-failed")
    host = Host(lambda fence: "never", outcome=outcome)
    ending = world.run(host)
    assert ending.kind is kind and host.bodies == 0
    if kind is Kind.RAISE:
        assert isinstance(ending.error, FailedBefore)


def test_a_second_copy_of_a_task_id_that_fails_after_anothers_mark_marks_nothing_and_ends_quietly() -> None:
    """Two copies of t-1 ran at once and both failed: the first's mark is the task id's one FAILURE."""
    world = World(fence_mode="commit")

    def body(fence: Any) -> Any:
        _mark(world, by="the-other-copy")  # the other copy failed first, while this one ran
        raise ValueError("this copy fails too")

    ending = world.run(Host(body))
    assert ending.kind is Kind.IGNORE and ending.failure is None
    state = world.memory.get("k")
    assert state is not None and (state.run or {}).get(ENDED_BY) == "the-other-copy"
    assert [e.event for e in world.memory.history("k")] == ["gave-up"]


def test_a_copy_beside_a_failed_run_has_its_claim_refused_and_ends_quietly() -> None:
    world = World(fence_mode="commit")

    def body(fence: Any) -> Any:
        _mark(world, by="the-other-copy")
        return "late"

    ending = world.run(Host(body))
    assert ending.kind is Kind.IGNORE
    assert [e.event for e in world.memory.history("k")] == ["gave-up", "refused"]
