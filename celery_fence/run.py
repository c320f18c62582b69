"""One fenced run, driven through the state machine of :mod:`celery_fence._decide`
(docs/guarantees.md#how-a-run-ends).

:class:`Run` makes the store calls, runs the body, asks :func:`~celery_fence._decide.decide` what each
outcome means, and returns how the run ends as an :class:`~celery_fence._delivery.Ending`; it raises nothing
of Celery's and sends nothing. What the body and Celery did becomes the table's events here
(docs/guarantees.md#every-exit): which exception left the body, how the run's transaction stood when the
body returned, how a completion failed; Celery's exceptions are all this module knows of Celery. Its host
(:class:`RunHost`, the task) runs the body, says what the result backend holds, hears what happened, and
performs the ending. Every pause comes from the :class:`~celery_fence.lease.LeasePolicy` and passes through
the runtime's clock and sleep, so the whole run can be driven without Celery or real time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property
from typing import Any, Protocol, cast

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from . import _failpoints
from ._decide import ENDED_BY, Action, Event, Facts, View, asks_backend, decide, holder_of, view_of
from ._delivery import ENDED_STATES, FAILED_STATES, Attempt, Ending, run_name
from ._owed import Released
from ._resends import Resends
from ._runtime import FenceRuntime, OnLost, OnRenewed
from .config import FenceConfig
from .errors import (
    AlreadyDone,
    ConfigurationError,
    FailedBefore,
    FenceError,
    LeaseHeld,
    LeaseLost,
    StaleToken,
    StoreUnavailable,
)
from .fence import CommitMode, Fence
from .lease import Lease, LeaseState
from .stores.base import CommitStore, RunTransactionHandle
from .stores.capabilities import capabilities_of

__all__ = ["Run", "RunHost", "decide", "quietly"]

log = logging.getLogger(__name__)

ACQUIRE_ATTEMPTS = 3  # acquire calls per round when the store does not answer (same owner each time)
ACQUIRE_ROUNDS = 5  # acquire -> read -> acquire again, when the key changes under us


class RunHost(Protocol):
    """What a run needs of its task: the body, the result backend's word, and someone to tell."""

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def outcome(self) -> str | None: ...  # this task id's state in the result backend; None: nothing tells
    def acquired(self, fence: Fence) -> None: ...
    def released(self, fence: Fence) -> None: ...
    def report(self, what: str, key: str, token: int, **fields: Any) -> None: ...


class Run:
    """One delivery of a fenced task: acquire, run, complete, and say how it ends."""

    def __init__(self, host: RunHost, runtime: FenceRuntime, config: FenceConfig, key: str,
                 run_info: Mapping[str, Any] | None, attempt: Attempt) -> None:
        self.host, self.runtime, self.config, self.policy = host, runtime, config, config.policy
        self.store = runtime.store
        self.key, self.run_info, self.attempt = key, run_info, attempt
        self.clock, self.sleep = runtime.clock, runtime.sleep
        self.name = run_name(attempt)
        self.state: LeaseState | None = None  # the last read of the key
        self.committed: tuple[Any] | None = None  # (result,) once the completion answered
        # fence_mode="commit": the transaction the acquire step opened, and the owner that names this run
        # in the key's row once its claim committed (its token is drawn by the claim)
        self.committing = config.mode == "commit"
        self.opened: RunTransactionHandle | None = None
        self.claimant: str | None = None

    @cached_property
    def resends(self) -> Resends:
        """How this run is sent again, or ends unrun: made only when it comes to that, never on an
        ordinary run."""
        return Resends(self.host, self.runtime, self.config, self.key, self.run_info, self.attempt)

    def execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Ending:
        try:
            return self._execute(args, kwargs)
        except Exception:
            if self.committed is None:
                raise
            # An interruption (a time limit) after the completion answered: the run succeeded all the same.
            log.warning("fence: %s was interrupted after its completion committed: SUCCESS", self.key)
            return self._end(decide(Facts(Event.COMPLETED_INTERRUPTED)), None, self.committed[0])

    # -- acquire --

    def _execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Ending:
        owner = self.runtime.new_owner()
        if _failpoints.armed:
            _failpoints.failpoint("before-acquire")
        for round_ in range(1, ACQUIRE_ROUNDS + 1):
            facts, lease, sent_at, problem = self._acquire(owner)
            if lease is not None and self._ended_before(lease):
                facts = Facts(Event.ENDED_BEFORE)
            action = self._decide(facts, token=0)
            if action is not Action.RUN and self.opened is not None:
                self.opened.close()
            if action is Action.RUN:
                assert lease is not None
                return self._run(lease, sent_at, args, kwargs)
            if action is Action.END_UNRUN:
                assert lease is not None
                log.warning("fence: %s ended FAILURE before: not run again", self.name)
                return self._released(Ending.ignoring(), lease)
            if action is Action.TAKE_BACK:
                self.resends.take_back(self.state)
            elif action is not Action.ACQUIRE_AGAIN:
                return self.resends.unrun(action, problem, self.state)
            self.sleep(self.policy.round_pause(round_))
        # The key kept changing under us: whoever holds it now, fence_on_busy decides.
        return self.resends.busy(LeaseHeld(self.key, None, None))

    def _ended_before(self, lease: Lease) -> bool:
        """Whether this task id ended FAILURE before: asked of the backend by a copy or a takeover only."""
        return bool(lease.taken_over or self.attempt.copy) and self.host.outcome() in FAILED_STATES

    def _acquire(self, owner: str) -> tuple[Facts, Lease | None, float, FenceError | None]:
        """One acquire, repeating a store hiccup with the same owner: an acquire that committed but whose
        answer was lost is found again (a store returns its own owner's live lease)."""
        for attempt in range(ACQUIRE_ATTEMPTS):
            sent_at = self.clock()
            try:
                lease = self._begin_commit(owner) if self.committing else self.store.acquire(
                    self.key, owner, self.policy.ttl, self.run_info
                )
                if _failpoints.armed:
                    _failpoints.failpoint("after-acquire")
                return Facts(Event.ACQUIRED), lease, sent_at, None
            except AlreadyDone as done:
                return Facts(Event.FINISHED), None, sent_at, done
            except FailedBefore as failed:  # fence_mode="commit": this task id's FAILURE marked the key
                return Facts(Event.FAILED_BEFORE), None, sent_at, failed
            except LeaseHeld as held:
                return Facts(Event.HELD), None, sent_at, held
            except StoreUnavailable as exc:
                if attempt == ACQUIRE_ATTEMPTS - 1:
                    return Facts(Event.ACQUIRE_UNKNOWN), None, sent_at, exc
                self.sleep(self.policy.acquire_pause * (attempt + 1))
        raise AssertionError("unreachable")

    def _begin_commit(self, owner: str) -> Lease:
        """``fence_mode="commit"``'s acquire: no lease, the run's transaction opened with a read of the key
        (a finished or leased key refuses it as an acquire would). From here the run is known by ``owner``
        (its token is 0 until its claim draws one)."""
        self.claimant = owner
        self.opened = self._commit_store().begin_commit(self.key, owner, self.policy.ttl, self.run_info)
        return Lease(self.key, 0, owner)

    def _commit_store(self) -> CommitStore:
        refusal = capabilities_of(self.store).commit_mode_refusal(self.name)
        if refusal is not None:
            raise ConfigurationError(refusal)
        return cast(CommitStore, self.store)  # what a store declaring fenced_commit implements

    # -- the body --

    def _run(self, lease: Lease, sent_at: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Ending:
        runtime = self.runtime
        if self.committing:  # no lease to renew: the claim at the end is the fence
            store = cast(CommitStore, self.store)  # its capability was checked by _begin_commit
            mode = CommitMode(store, self.policy.ttl, self.run_info)
            fence = Fence(self.store, lease, None, self.policy.ttl, self.clock, mode, self.opened)
        else:
            fence = Fence(self.store, lease, runtime.renewer, self.policy.ttl, self.clock)
            runtime.renewer.track(lease, self.policy, sent_at, *self._hooks(fence))
        self.host.acquired(fence)
        try:
            ending = self._attempt(fence, args, kwargs)
        except BaseException:
            self._let_go(fence)
            raise
        try:
            self._let_go(fence)
        except Exception as exc:  # an interrupt (a time limit) in the run's last steps: its ending stands
            log.warning("fence: %s was interrupted once its ending was decided: %r", self.name, exc)
        return ending

    def _let_go(self, fence: Fence) -> None:
        try:
            fence.abort()
            self.runtime.renewer.untrack(fence.lease)
        finally:
            self.host.released(fence)

    def _attempt(self, fence: Fence, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Ending:
        try:
            self.runtime.flush_owed(self.store)  # the store answers again: what this process owes it
            result = self._body(fence, args, kwargs)
        except (LeaseLost, StaleToken) as exc:
            return self._refused(fence, exc)
        except StoreUnavailable as exc:  # a fenced write's outcome is unknown: run again
            log.warning("fence: store unavailable in %s, re-queued: %s", self.key, exc)
            return self._end(decide(Facts(Event.BODY_UNKNOWN)), fence, None, self.policy.interval, cause=exc)
        except BaseException as exc:
            event = body_event(exc)
            failed = bool(self.claimant) and event in (Event.RAISED, Event.INTERRUPTED)
            marked = failed and self._marks(fence, exc)
            action = self._decide(Facts(event, marked=marked), fence.token)
            return self._end(action, fence, None, cause=exc)
        return self._complete(fence, result)

    def _marks(self, fence: Fence, exc: BaseException) -> bool:
        """``fence_mode="commit"``: mark the key failed by this run (``strand``: a free key not marked by
        this task id yet), so that the claim of a copy of this task id running beside it is refused from
        now on, and a copy sent later ends with this FAILURE. ``False``: a copy claimed or marked the key
        first, or the store did not answer; then the read decides."""
        fence.abort()  # first: on SQLite this run's transaction holds the write lock that the mark needs
        reason = f"{self.name} ended FAILURE ({type(exc).__name__})"
        # The mark names this run, so a read after a mark whose reply was lost knows it for its own.
        marked = {**(self.run_info or {}), ENDED_BY: self.claimant}
        answer = bool(quietly(self.store.strand, self.key, marked, reason))
        if _failpoints.armed:
            _failpoints.failpoint("after-mark")
        return answer

    def _hooks(self, fence: Fence) -> tuple[OnLost, OnRenewed]:
        def on_lost(lost: Lease, reason: str) -> None:  # the renewer's thread
            fence.mark_lost(reason)
            self.host.report("lost", lost.key, lost.token, reason=reason)
            self.runtime.interrupter.fire_for(fence)  # only a run armed with fence_interrupt is interrupted

        def on_renewed(renewed: Lease) -> None:
            self.host.report("renewed", renewed.key, renewed.token)

        return on_lost, on_renewed

    def _body(self, fence: Fence, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.config.interrupt:
            return self.host.body(args, kwargs)
        interrupter, ident = self.runtime.interrupter, threading.get_ident()
        try:  # armed inside the try: an interrupt that lands as arm() returns is still disarmed
            interrupter.arm(fence)
            return self.host.body(args, kwargs)
        finally:
            interrupter.disarm(ident)

    def _refused(self, fence: Fence, exc: LeaseLost | StaleToken) -> Ending:
        fence.abort()
        if isinstance(exc, LeaseLost):  # refused here, before the store saw a write
            quietly(self.store.refuse, fence.lease, f"lease lost: {exc.reason}")
        elif not exc.recorded:  # refused by the resource itself (fenced_update): put it in the history too
            quietly(self.store.refuse, fence.lease, exc.what)
        action = self._decide(Facts(Event.REFUSED), token=fence.token)
        return self._end(action, fence, None, reason=str(exc), cause=exc)

    # -- completion --

    def _complete(self, fence: Fence, result: Any) -> Ending:
        """Commit the result; an unknown outcome is read back, never guessed
        (docs/guarantees.md#how-a-run-ends)."""
        deadline = None if self.claimant else self.runtime.renewer.deadline(fence.lease)
        deadline = deadline if deadline is not None else self.clock() + self.policy.ttl
        self.runtime.renewer.untrack(fence.lease)  # no renew of a lease whose completion may have committed
        if _failpoints.armed:
            _failpoints.failpoint("before-complete")
        action = decide(Facts(returned_event(fence)))
        if action is not Action.COMPLETE:  # the run's transaction was lost with earlier writes
            lost = StoreUnavailable(f"the run's transaction on key {self.key!r} was lost with earlier writes")
            return self._end(action, fence, None, self.policy.interval, cause=lost)
        joined = fence.joined
        while True:
            try:
                fence.commit(result)
                self.committed = (result,)
                return self._end(decide(Facts(Event.COMPLETED)), fence, result)
            except (StaleToken, StoreUnavailable) as exc:
                cause: BaseException = exc
                event = completion_event(exc)
            except BaseException as exc:  # interrupted with the reply due, or nothing sent (NotSerializable)
                cause, event = exc, Event.COMPLETE_INTERRUPTED
                if not isinstance(exc, Exception):  # SystemExit: the process goes; the store says the rest
                    raise
            action = self._read_until(Facts(event, joined=joined), fence.token, deadline)
            if action is not Action.CALL_AGAIN:
                return self._end(action, fence, result, self.policy.interval, "completion", cause)
            self.sleep(self.policy.read_pause)

    def _read_until(self, facts: Facts, token: int, deadline: float) -> Action:
        while True:
            facts = replace(facts, deadline_passed=self.clock() >= deadline)
            action = self._decide(facts, token)
            if action is not Action.READ:
                return action
            self.sleep(self.policy.read_pause)  # the store did not answer the read

    # -- deciding and ending --

    def _decide(self, facts: Facts, token: int) -> Action:
        """``decide``, reading the key when the table asks for it (once per call)."""
        action = decide(facts)
        if action is not Action.READ:
            return action
        try:
            self.state = self.store.get(self.key)
        except StoreUnavailable as exc:
            log.warning("fence: could not read %s: %s", self.key, exc)
            self.state = None
            # A finished key, a failed body: the result backend still tells whether this task id ended.
            delivered = asks_backend(facts.event, View.UNREAD) and self.host.outcome() in ENDED_STATES
            return decide(replace(facts, read_failed=True, delivered=delivered))
        view = view_of(self.state, token, self.attempt.task_id, self.attempt.handoff, self.claimant)
        outcome = self.host.outcome() if asks_backend(facts.event, view) else "unasked"
        # Nothing to wait for when nothing can tell (eager, no result backend), or waited already.
        waited_for = self.attempt.awaited_token
        wait_over = outcome is None or (self.state is not None and self.state.token == waited_for)
        return decide(replace(facts, view=view, delivered=outcome in ENDED_STATES, wait_over=wait_over))

    def _end(self, action: Action, fence: Fence | None, result: Any, countdown: float = 0.0, reason: str = "",
             cause: BaseException | None = None) -> Ending:
        if action is Action.SUCCEED:
            return Ending.returning(result)
        if action is Action.RETURN_STORED:  # a read found the key finished with this run's own token
            assert self.state is not None, action
            return Ending.returning(self.state.result)
        assert fence is not None, action
        if action is Action.ABSORB:  # a stale run: a copy of this task id has the key and its ending
            log.warning("fence: %s failed, but a copy of it has %s: its ending stands", self.name, self.key)
            return Ending.ignoring()
        if action is Action.FAIL:  # the body's own ending: Celery's course, the lease given back first
            assert cause is not None
            fence.abort()
            return self._released(Ending.raising(cause), fence.lease)
        if action is Action.REQUEUE:
            fence.abort()
            why, unknown = reason or "its outcome is unknown", reason == "completion"
            return self.resends.resend(self._held(fence), countdown, cause, why, unknown)
        return self._refusal(action, fence, reason, cause)

    def _refusal(self, action: Action, fence: Fence, reason: str, cause: BaseException | None) -> Ending:
        self.host.report("refused", fence.key, fence.token, reason=reason or "refused")
        if action is Action.REFUSE_IGNORE:
            return Ending.ignoring()
        if action is Action.REFUSE_REQUEUE:
            fence.abort()
            return self.resends.resend(
                self._held(fence), 0.0, cause, reason or "refused, nobody took over", False
            )
        state = self.state
        assert state is not None, action  # the winner and the superseding run are known by a read of the key
        if action is Action.REFUSE_WINNER:
            return Ending.returning(state.result)
        assert action is Action.REFUSE_SUPERSEDED, action
        return Ending.raising(LeaseHeld(fence.key, holder_of(state), state.expires_in))

    def _held(self, fence: Fence) -> Lease | None:
        """The lease this run holds, to hand to its copy: none in ``fence_mode="commit"``."""
        return None if self.claimant else fence.lease

    def _released(self, ending: Ending, lease: Lease) -> Ending:
        """Give the lease back now; a release that does not reach the store is owed (written once the store
        answers), so the lease does not expire into recovery's hands and the run is not run again."""
        if self.committing:  # no lease: its transaction rolled back, nothing to give back
            return ending
        try:
            self.store.release(lease)
        except FenceError as exc:
            log.warning("fence: release of %s failed, owed: %s", lease.key, exc)
            self.runtime.owed.write(self.store, Released(self.attempt.task_id, lease))
        return ending


# -- what happened, as the table's events --


def body_event(exc: BaseException) -> Event:
    """What the body's exception means to Celery (and so to the run)."""
    if isinstance(exc, Retry):
        return Event.RETRIED
    if isinstance(exc, Reject):
        return Event.REJECTED
    if isinstance(exc, Ignore):
        return Event.IGNORED
    if isinstance(exc, (SoftTimeLimitExceeded, TimeLimitExceeded)) or not isinstance(exc, Exception):
        return Event.INTERRUPTED
    return Event.RAISED


def returned_event(fence: Fence) -> Event:
    if fence.work_lost:
        return Event.RETURNED_WORK_LOST
    return Event.RETURNED_BLOCK_UNDONE if fence.block_undone else Event.RETURNED


def completion_event(exc: StaleToken | StoreUnavailable) -> Event:
    if isinstance(exc, StaleToken):
        return Event.COMPLETE_REFUSED
    log.warning("fence: completion unconfirmed, reading the key: %s", exc)
    return Event.COMPLETE_UNKNOWN


def quietly(fn: Any, *args: Any) -> Any:
    """Best-effort store calls on the way out: a failure leaves the lease to expire by its ttl."""
    try:
        return fn(*args)
    except FenceError as exc:
        log.warning("fence: %s failed: %s", getattr(fn, "__name__", fn), exc)
        return None
