"""One fenced run, driven through the state machine of :mod:`celery_fence._decide` (DESIGN.md §3).

:class:`Run` makes the store calls, runs the body and asks :func:`~celery_fence._decide.decide` what each
outcome means; every way a run can end is one of the decide table's actions, carried out here. What is
Celery's (re-sending a message, ``retry``, ``Ignore``, events and signals) it asks of its task
(:class:`RunHost`, implemented by ``FencedTask``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, NoReturn, Protocol

from celery.exceptions import Ignore

from ._decide import Action, Event, Facts, View, decide, view_of
from ._failpoints import failpoint
from ._runtime import FenceRuntime
from .config import FenceConfig
from .errors import (
    AlreadyDone,
    FenceError,
    LeaseHeld,
    LeaseLost,
    StaleToken,
    StoreUnavailable,
)
from .fence import Fence
from .lease import Lease, LeaseState
from .renewer import OnLost, OnRenewed

__all__ = ["Run", "RunHost", "decide", "quietly"]

log = logging.getLogger(__name__)

ACQUIRE_ATTEMPTS = 3  # acquire calls per round when the store does not answer (same owner each time)
ACQUIRE_ROUNDS = 5  # acquire -> read -> acquire again, when the key changes under us


class RunHost(Protocol):
    """What a run needs of its Celery task (``FencedTask``)."""

    request: Any

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def started(self, fence: Fence) -> tuple[OnLost, OnRenewed]: ...
    def ended(self, fence: Fence) -> None: ...
    def duplicate(self, key: str, token: int, reason: str) -> None: ...
    def refused(self, fence: Fence, reason: str) -> None: ...
    def delivered(self) -> bool | None: ...
    def requeue(
        self, countdown: float, handing_back: Lease | None = None, cause: BaseException | None = None
    ) -> NoReturn: ...
    def busy(self, held: LeaseHeld, config: FenceConfig) -> Any: ...
    def look_again(self, held: LeaseHeld, config: FenceConfig) -> NoReturn: ...
    def await_delivery(self, key: str, token: int, config: FenceConfig) -> NoReturn: ...
    def wait_out(self, exc: StoreUnavailable, config: FenceConfig, key: str, run_info: Any) -> NoReturn: ...
    def superseded(self, fence: Fence, state: LeaseState | None) -> NoReturn: ...


class Run:
    """One delivery of a fenced task: acquire, run, complete, and end as the decide table says."""

    def __init__(
        self,
        host: RunHost,
        runtime: FenceRuntime,
        config: FenceConfig,
        key: str,
        run_info: Any,
        handoff: int | None,
        awaited: int | None = None,
    ) -> None:
        self.host, self.runtime, self.config = host, runtime, config
        self.store = runtime.store
        self.key, self.run_info, self.handoff, self.awaited = key, run_info, handoff, awaited
        self.task_id: str = host.request.id
        self.state: LeaseState | None = None  # the last read of the key

    # -- acquire --

    def execute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        owner = self.runtime.new_owner()
        failpoint("before-acquire")
        for round_ in range(1, ACQUIRE_ROUNDS + 1):
            facts, lease, sent_at, problem = self._acquire(owner)
            action = self._decide(facts, token=0)
            if action is Action.RUN:
                assert lease is not None
                return self._run(lease, sent_at, args, kwargs)
            if action is Action.TAKE_BACK:
                self._take_back()
            elif action is not Action.ACQUIRE_AGAIN:
                return self._end_unrun(action, problem)
            time.sleep(0.05 * round_)  # e.g. the earlier attempt is still rolling its transaction back
        # The key kept changing under us: whoever holds it now, fence_on_busy decides.
        return self.host.busy(LeaseHeld(self.key, None, None), self.config)

    def _acquire(self, owner: str) -> tuple[Facts, Lease | None, float, FenceError | None]:
        """One acquire, repeating a store hiccup with the same owner: an acquire that committed but whose
        answer was lost is found again (a store returns its own owner's live lease)."""
        for attempt in range(ACQUIRE_ATTEMPTS):
            sent_at = time.monotonic()
            try:
                lease = self.store.acquire(self.key, owner, self.config.policy.ttl, self.run_info)
                failpoint("after-acquire")
                return Facts(Event.ACQUIRED), lease, sent_at, None
            except AlreadyDone as done:
                return Facts(Event.FINISHED), None, sent_at, done
            except LeaseHeld as held:
                return Facts(Event.HELD), None, sent_at, held
            except StoreUnavailable as exc:
                if attempt == ACQUIRE_ATTEMPTS - 1:
                    return Facts(Event.ACQUIRE_UNKNOWN), None, sent_at, exc
                time.sleep(min(0.5, self.config.policy.interval / 4) * (attempt + 1))
        raise AssertionError("unreachable")

    def _take_back(self) -> None:
        """The attempt that re-queued this copy still holds the key (its release failed): it ended, so give
        its lease back for it (token-checked: a takeover in between makes this a no-op)."""
        state = self.state
        assert state is not None
        try:
            self.store.release(Lease(self.key, state.token, state.owner or ""))
            log.info("fence: %s took %s back from its earlier attempt", self.task_id, self.key)
        except StoreUnavailable as exc:
            log.warning("fence: could not take %s back from its earlier attempt: %s", self.key, exc)

    def _end_unrun(self, action: Action, problem: FenceError | None) -> Any:
        state = self.state
        if action is Action.AWAIT_DELIVERY:
            assert state is not None
            self.host.await_delivery(self.key, state.token, self.config)
        if action is Action.RETURN_STORED:
            token = state.token if state is not None else getattr(problem, "token", 0)
            self.host.duplicate(self.key, token, "done")
            return state.result if state is not None else getattr(problem, "result", None)
        if action is Action.ABSORB:
            self.host.duplicate(self.key, state.token if state else 0, "done")
            raise Ignore()
        if action is Action.ABSORB_LATER:
            assert isinstance(problem, LeaseHeld)
            self.host.duplicate(self.key, 0, "held")
            self.host.look_again(problem, self.config)
        if action is Action.WAIT_OUT:
            assert isinstance(problem, StoreUnavailable)
            self.host.wait_out(problem, self.config, self.key, self.run_info)
        assert action is Action.BUSY and isinstance(problem, LeaseHeld), action
        if state is not None and state.owner:  # name the holder, its task id too
            problem = LeaseHeld(self.key, _holder(state), problem.expires_in)
        return self.host.busy(problem, self.config)

    # -- the body --

    def _run(self, lease: Lease, sent_at: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        runtime = self.runtime
        fence = Fence(self.store, lease, runtime.renewer, self.config.policy.ttl)
        runtime.renewer.track(lease, self.config.policy, sent_at, *self.host.started(fence))
        try:
            try:
                runtime.owed.flush(self.store)  # the store answers again: what this process owes it
                result = self._body(fence, args, kwargs)
            except (LeaseLost, StaleToken) as exc:
                return self._refused(fence, exc)
            except StoreUnavailable as exc:  # a fenced write's outcome is unknown: run again
                log.warning("fence: store unavailable in %s[%s], re-queued: %s", self.key, self.task_id, exc)
                fence.abort()
                return self._end(Action.REQUEUE, fence, None, self.config.policy.interval, cause=exc)
            except BaseException:
                fence.abort()
                quietly(self.store.release, lease)
                raise
            return self._complete(fence, result)
        finally:
            fence.abort()
            runtime.renewer.untrack(lease)
            self.host.ended(fence)

    def _body(self, fence: Fence, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.config.interrupt:
            return self.host.body(args, kwargs)
        interrupter, ident = self.runtime.interrupter, threading.get_ident()
        try:  # armed inside the try: an interrupt that lands as arm() returns is still disarmed
            interrupter.arm(fence)
            return self.host.body(args, kwargs)
        finally:
            interrupter.disarm(ident)

    def _refused(self, fence: Fence, exc: LeaseLost | StaleToken) -> Any:
        fence.abort()
        if isinstance(exc, LeaseLost):  # refused here, before the store saw a write
            quietly(self.store.refuse, fence.lease, f"lease lost: {exc.reason}")
        elif not exc.recorded:  # refused by the resource itself (fenced_update): put it in the history too
            quietly(self.store.refuse, fence.lease, exc.what)
        action = self._decide(Facts(Event.REFUSED), token=fence.token)
        return self._end(action, fence, None, 0.0, reason=str(exc), cause=exc)

    # -- completion --

    def _complete(self, fence: Fence, result: Any) -> Any:
        """Commit the result; an unknown outcome is read back, never guessed (DESIGN.md §1)."""
        deadline = self.runtime.renewer.deadline(fence.lease)
        deadline = deadline if deadline is not None else time.monotonic() + self.config.policy.ttl
        self.runtime.renewer.untrack(fence.lease)  # no renew of a lease whose completion may have committed
        failpoint("before-complete")
        joined = fence.joined
        while True:
            try:
                fence.commit(result)
                return self._end(Action.SUCCEED, fence, result, 0.0)
            except (StaleToken, StoreUnavailable) as exc:
                event = self._completion_event(exc)
            except BaseException:  # nothing was stored (e.g. NotSerializable): a failed run, released
                fence.abort()
                quietly(self.store.release, fence.lease)
                raise
            facts = Facts(event, joined=joined)
            while True:
                facts = replace(facts, deadline_passed=time.monotonic() >= deadline)
                action = self._decide(facts, token=fence.token)
                if action is not Action.READ:
                    break
                time.sleep(min(1.0, self.config.policy.interval / 4))  # the store did not answer the read
            if action is not Action.CALL_AGAIN:
                return self._end(action, fence, result, self.config.policy.interval, reason="completion")
            time.sleep(min(1.0, self.config.policy.interval / 4))

    def _completion_event(self, exc: StaleToken | StoreUnavailable) -> Event:
        if isinstance(exc, StaleToken):
            return Event.COMPLETE_REFUSED
        log.warning("fence: completion of %s unconfirmed, reading the key: %s", self.key, exc)
        return Event.COMPLETE_UNKNOWN

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
            return decide(replace(facts, read_failed=True))
        view = view_of(self.state, token, self.task_id, self.handoff)
        copy = view in (View.SAME_TASK_DONE, View.MINE_DONE) and facts.event is Event.FINISHED
        delivered = self.host.delivered() if copy else False
        # Nothing to wait for when nothing can tell (eager, no result backend), or waited already.
        awaited = delivered is None or (self.state is not None and self.state.token == self.awaited)
        return decide(replace(facts, view=view, delivered=bool(delivered), awaited=awaited))

    def _end(
        self,
        action: Action,
        fence: Fence,
        result: Any,
        countdown: float,
        reason: str = "",
        cause: BaseException | None = None,
    ) -> Any:
        if action is Action.SUCCEED:
            return result
        if action is Action.RETURN_STORED:
            return result if self.state is None else self.state.result
        if action is Action.REQUEUE:
            self.host.requeue(countdown, handing_back=fence.lease, cause=cause)
        self.host.refused(fence, reason or "refused")
        if action is Action.REFUSE_IGNORE:
            raise Ignore()
        if action is Action.REFUSE_REQUEUE:
            self.host.requeue(0.0, handing_back=fence.lease, cause=cause)
        if action is Action.REFUSE_WINNER:
            return None if self.state is None else self.state.result
        assert action is Action.REFUSE_SUPERSEDED, action
        self.host.superseded(fence, self.state)


def quietly(fn: Any, *args: Any) -> Any:
    """Best-effort store calls on the way out: a failure leaves the lease to expire by its ttl."""
    try:
        return fn(*args)
    except FenceError as exc:
        log.warning("fence: %s failed: %s", getattr(fn, "__name__", fn), exc)
        return None


def _holder(state: LeaseState) -> str:
    task_id = (state.run or {}).get("id")
    return f"{state.owner} (task {task_id})" if task_id else str(state.owner)
