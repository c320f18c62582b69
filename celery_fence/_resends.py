"""How a run ends without running its body, and the fence's own sending again of a run
(docs/guarantees.md#every-exit).

A run that cannot end now (an unavailable store, a key another task id holds, a refusal nobody took over,
an unknown outcome) is sent again with the same task id and the same ``retries``: the fence never spends the
task's ``max_retries``. Each kind is bounded by a setting of the fence (``fence_store_wait``,
``fence_busy_wait``, ``fence_max_resends``) and giving up leaves a record: the key marked given up in the
store, the reason in the log. The headers that carry a wait's clock are that wait's own (:mod:`._delivery`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ._decide import Action, holder_of
from ._delivery import (
    AWAITED,
    BUSY_SINCE,
    ENDED_STATES,
    LOOKS,
    RESENDS,
    WAITING_SINCE,
    WAITS,
    Attempt,
    Ending,
    Stranded,
    run_name,
)
from ._runtime import FenceRuntime
from .config import FenceConfig
from .errors import FailedBefore, FenceError, GaveUp, LeaseHeld, StoreUnavailable
from .lease import Lease, LeaseState

__all__ = ["Resends"]

log = logging.getLogger(__name__)


class Host(Protocol):
    """What sending a run again needs of the run's host (:class:`~celery_fence.run.RunHost`): the result
    backend's word, and someone to tell."""

    def outcome(self) -> str | None: ...
    def report(self, what: str, key: str, token: int, **fields: Any) -> None: ...


class Resends:
    """How one run is sent again, for :class:`~celery_fence.run.Run`."""

    def __init__(
        self,
        host: Host,
        runtime: FenceRuntime,
        config: FenceConfig,
        key: str,
        run_info: Mapping[str, Any] | None,
        attempt: Attempt,
    ) -> None:
        self.host, self.runtime, self.config, self.policy = host, runtime, config, config.policy
        self.key, self.run_info, self.attempt = key, run_info, attempt
        self.name = run_name(attempt)

    def take_back(self, state: LeaseState | None) -> None:
        """The attempt that re-queued this copy still holds the key (its release failed): it ended, so give
        its lease back for it (token-checked: a takeover in between makes this a no-op)."""
        assert state is not None
        try:
            self.runtime.store.release(Lease(self.key, state.token, state.owner or ""))
            log.info("fence: %s took %s back from its earlier attempt", self.name, self.key)
        except StoreUnavailable as exc:
            log.warning("fence: could not take %s back from its earlier attempt: %s", self.key, exc)

    def unrun(self, action: Action, problem: FenceError | None, state: LeaseState | None) -> Ending:
        """End a run whose body did not run, as the table said (``state``: the key as last read)."""
        if action in (Action.AWAIT_DELIVERY, Action.DELIVER_FAILURE):
            return self.undelivered(action, problem, state)
        if action is Action.RETURN_STORED:
            token = state.token if state is not None else getattr(problem, "token", 0)
            self.host.report("duplicate", self.key, token, reason="done")
            return Ending.returning(state.result if state is not None else getattr(problem, "result", None))
        if action is Action.ABSORB:
            self.host.report("duplicate", self.key, state.token if state else 0, reason="done")
            return Ending.ignoring()
        if action is Action.ABSORB_LATER:
            assert isinstance(problem, LeaseHeld)
            self.host.report("duplicate", self.key, 0, reason="held")
            looks = self.attempt.looks
            countdown = self.policy.look_again_countdown(problem.expires_in, looks)
            return self.send_again(countdown, {LOOKS: looks + 1})
        if action is Action.WAIT_OUT:
            assert isinstance(problem, StoreUnavailable)
            return self.wait_out(problem)
        assert action is Action.BUSY and isinstance(problem, LeaseHeld), action
        if state is not None and state.owner:  # name the holder, its task id too
            problem = LeaseHeld(self.key, holder_of(state), problem.expires_in)
        return self.busy(problem)

    def undelivered(self, action: Action, problem: FenceError | None, state: LeaseState | None) -> Ending:
        """A run of this task id ended the key and its ending is not stored yet: wait a ttl for it, then
        (``DELIVER_FAILURE``) end with the FAILURE that run marked and never delivered."""
        if action is Action.DELIVER_FAILURE:  # the marking run's worker stopped before Celery stored it
            assert isinstance(problem, FailedBefore), action
            log.warning("fence: %s ends with the FAILURE an earlier run of it never delivered", self.name)
            self.host.report("duplicate", self.key, problem.token, reason="failed")
            return Ending.raising(problem)
        token = state.token if state is not None else getattr(problem, "token", 0)
        countdown = self.policy.await_countdown
        ended = "marked failed" if isinstance(problem, FailedBefore) else "finished"
        log.info(
            "fence: %s finds %s %s, not delivered yet: looks again in %.1fs", self.name, self.key, ended,
            countdown,
        )
        return self.send_again(countdown, {AWAITED: token})

    def busy(self, held: LeaseHeld) -> Ending:
        """Another task id holds the key: ``fence_on_busy`` decides. "retry" looks again (sooner than the
        holder's ttl, no ``max_retries`` spent) until the key is done or ``fence_busy_wait`` has passed."""
        if self.ended():
            return Ending.ignoring()
        on_busy = self.config.on_busy
        if on_busy == "ignore":  # ends ready, never PENDING: the caller learns who holds the key
            self.host.report("duplicate", held.key, 0, reason="held", detail=str(held))
            return Ending.ignoring(failure=held)
        if on_busy == "fail" or self.attempt.eager:  # apply() has no queue to go back to
            return Ending.raising(held)
        now = self.runtime.wall()
        since = self.attempt.busy_since or now
        if now - since >= self.config.busy_wait:
            log.error("fence: %s gave up on busy key %r after %.0fs (fence_busy_wait)", self.name, held.key,
                      now - since)
            return Ending.raising(held)
        looks = self.attempt.looks
        countdown = self.policy.look_again_countdown(held.expires_in, looks)
        return Ending.sending_again(countdown, {BUSY_SINCE: since, LOOKS: looks + 1}, shown_as_retry=held)

    def ended(self) -> bool:
        """Whether this task id already ended (its callbacks or errbacks ran), asked before an ending that
        would store RETRY or FAILURE over it: a late copy (a duplicate the broker did not mark) that finds
        the key busy or the store down must not overwrite that ending, nor let a later copy run the body
        because the backend no longer says FAILURE. Only on these slow paths: no read on an ordinary run."""
        ended = self.host.outcome()
        if ended not in ENDED_STATES:
            return False
        log.warning("fence: %s already ended %s: this late copy is absorbed, not run", self.name, ended)
        self.host.report("duplicate", self.key, 0, reason="ended")
        return True

    def wait_out(self, exc: StoreUnavailable) -> Ending:
        """The store did not answer the acquire: nothing ran, no lease is held. Send the message again later
        until ``fence_store_wait`` has passed since the first failure; then give up with a record."""
        now, wait = self.runtime.wall(), self.config.store_wait
        since = self.attempt.waiting_since or now
        waited = now - since
        if self.attempt.eager or waited >= wait:
            if self.ended():
                return Ending.ignoring()
            log.error(
                "fence: gave up on %s (key %r): the store stayed unavailable for %.0fs (fence_store_wait "
                "%gs); the body never ran: %s", self.name, self.key, waited, wait, exc,
            )
            self.host.report("gave up", self.key, 0, waited=waited)
            reason = f"waiting out the unavailable store ({waited:.0f}s, fence_store_wait {wait:g}s)"
            return Ending.raising(exc, record=self.record(reason))
        countdown = self.policy.store_wait_countdown(self.attempt.waits, wait - waited)
        log.warning(
            "fence: store unavailable for %s (key %r), waiting it out (again in %.1fs, max_retries not "
            "spent): %s", self.name, self.key, countdown, exc,
        )
        return self.send_again(countdown, {WAITING_SINCE: since, WAITS: self.attempt.waits + 1})

    def resend(
        self, lease: Lease | None, first: float, cause: BaseException | None, reason: str,
        may_have_committed: bool,
    ) -> Ending:
        """The fence sends the run again (same id, no ``max_retries`` spent), handing its lease (if it holds
        one) to the copy; after ``fence_max_resends`` it gives up with a record instead."""
        if self.attempt.eager and may_have_committed:  # apply(): no copy to find out, so say it is unknown
            unknown = StoreUnavailable(f"the completion of {self.key!r} may have committed, unknown: {cause}")
            unknown.__cause__ = cause
            return Ending.raising(unknown, hand_back=lease)
        resends = self.attempt.resends
        if resends < self.config.max_resends:
            countdown = self.policy.resend_countdown(first, resends)
            return self.send_again(countdown, {RESENDS: resends + 1}, lease, cause)
        gave_up = GaveUp(self.key, resends, reason)
        log.error("fence: %s: %s", self.name, gave_up)
        record = self.record(f"after {resends} re-sends by the fence ({reason}): fence_max_resends")
        if may_have_committed:
            return Ending.ignoring(hand_back=lease, record=record)  # never FAILURE
        return Ending.raising(gave_up, hand_back=lease, record=record)

    def send_again(
        self,
        countdown: float,
        headers: dict[str, Any],
        hand_back: Lease | None = None,
        cause: BaseException | None = None,
    ) -> Ending:
        if self.attempt.eager:  # apply() has no queue to go back to: the caller sees why
            if cause is not None:
                return Ending.raising(cause, hand_back=hand_back)
            return Ending.ignoring(hand_back=hand_back)
        return Ending.sending_again(countdown, headers, hand_back)

    def record(self, why: str) -> Stranded | None:
        """The give-up record ``celery fence leases`` shows: ``name[id] gave up <why>``."""
        if self.attempt.eager:  # apply() raises to its caller instead
            return None
        return Stranded(self.attempt.task_id, self.key, self.run_info, f"{self.name} gave up {why}")
