"""How a run ends: the pure decision table of the run's state machine (docs/guarantees.md#how-a-run-ends).
Standard library only.

A run goes acquire -> body -> complete. At each step something happens (:class:`Event`) and, when that alone
cannot say what it means, the run reads the key's state and classifies it (:class:`View`, by
:func:`view_of`). :func:`decide` maps the two to what the run does next (:class:`Action`). The events are
what the store answered and what the body and Celery did (docs/guarantees.md#every-exit): the body returned,
raised, retried, rejected, ignored, caught the failure of its first ``transaction()`` block, or was
interrupted (a time limit, ``SystemExit``) before, during or after its completion. Every store call
has three outcomes, treated apart: answered, failed before the store acted, and unknown (sent, reply lost);
the last two arrive here as the same ``*_UNKNOWN`` event, because a client cannot tell them apart, and the
rows for them are the ones that must hold either way: an unknown outcome is resolved by reading the
store (our own token finished: it committed) or, when even that fails, by sending the run again (the copy
finds the key finished, or takes it back from this attempt through the hand-off token).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .lease import ENDED_BY, LeaseState

__all__ = ["ENDED_BY", "Action", "Event", "Facts", "View", "asks_backend", "decide", "holder_of", "view_of"]


class Event(enum.Enum):
    ACQUIRED = "acquired"  # the store granted the lease
    FINISHED = "finished"  # acquire: the key is done (AlreadyDone)
    HELD = "held"  # acquire: a live lease elsewhere (LeaseHeld)
    ACQUIRE_UNKNOWN = "acquire unknown"  # acquire raised StoreUnavailable after its retries
    ENDED_BEFORE = "ended before"  # acquired by takeover, but this task id already ended FAILURE
    FAILED_BEFORE = "failed before"  # fence_mode="commit": a run of this task id marked the key failed
    RETURNED = "returned"  # the body returned: complete next
    RETURNED_BLOCK_UNDONE = "returned, block undone"  # ... after catching its first transaction() block's
    # failure: that block rolled the run's transaction back, nothing else was in it
    RETURNED_WORK_LOST = "returned, work lost"  # ... but the run's transaction was lost with earlier blocks
    RAISED = "raised"  # the body raised an ordinary exception (Celery stores FAILURE)
    RETRIED = "retried"  # the body called self.retry() with retries left (Retry: Celery sent the copy)
    REJECTED = "rejected"  # the body raised Reject
    IGNORED = "ignored"  # the body raised Ignore
    INTERRUPTED = "interrupted"  # a time limit or another BaseException hit the body
    REFUSED = "refused"  # LeaseLost or StaleToken left the body
    BODY_UNKNOWN = "body unknown"  # StoreUnavailable left the body: a fenced write's outcome is unknown
    COMPLETED = "completed"  # complete answered: committed
    COMPLETED_INTERRUPTED = "completed, interrupted"  # an interruption landed after complete answered
    COMPLETE_REFUSED = "complete refused"  # complete answered StaleToken
    COMPLETE_UNKNOWN = "complete unknown"  # complete raised StoreUnavailable: committed or not, unknown
    COMPLETE_INTERRUPTED = "complete interrupted"  # an interruption landed while complete's reply was due


class View(enum.Enum):
    """The key's state as this run sees it (read after an event that needs it)."""

    UNREAD = "unread"  # not read yet, or (``Facts.read_failed``) the read failed
    GONE = "gone"  # the store does not know the key (pruned)
    MINE_DONE = "mine done"  # finished with this run's token: its completion committed
    MINE_HELD = "mine held"  # this run's token, not finished, still leased (live or lapsed)
    MINE_FREE = "mine free"  # this run's token, not finished, released
    HANDED_OFF = "handed off"  # held by the earlier attempt that sent this copy (its hand-off token)
    SAME_TASK = "same task"  # another run of this task id holds the key
    SAME_TASK_DONE = "same task done"  # another run of this task id finished the key
    SAME_TASK_FAILED = "same task failed"  # another run of this task id marked the key failed (its FAILURE)
    OTHER_TASK = "other task"  # a run of another task id holds the key
    OTHER_TASK_DONE = "other task done"  # a run of another task id finished the key
    FREE = "free"  # not finished, nobody holds it, not this run's token (e.g. an admin release)


class Action(enum.Enum):
    RUN = "run"  # run the body
    COMPLETE = "complete"  # store the result with the token
    SUCCEED = "succeed"  # return the body's result (stored by the completion)
    RETURN_STORED = "return stored"  # return the key's stored result without running the body
    ABSORB = "absorb"  # a duplicate whose result was already delivered: end quietly (Ignore)
    ABSORB_LATER = "absorb later"  # a duplicate of a running copy: send again later in case it dies
    AWAIT_DELIVERY = "await delivery"  # a copy of a finished run not delivered yet: look again after a ttl
    DELIVER_FAILURE = "deliver failure"  # the run that marked the key failed never stored it: end FAILURE
    TAKE_BACK = "take back"  # release the hand-off lease of the attempt that sent us, acquire again
    ACQUIRE_AGAIN = "acquire again"  # the key changed between the acquire and the read
    BUSY = "busy"  # another task holds the key: fence_on_busy decides
    WAIT_OUT = "wait out"  # the store did not answer the acquire: come back later (nothing ran)
    FAIL = "fail"  # roll back, release the lease, let the exception take Celery's course
    READ = "read"  # read the key's state, then decide again
    CALL_AGAIN = "call again"  # repeat the completion (it did not commit; the token is still ours)
    REQUEUE = "requeue"  # send the run again (same id), hand the lease to the copy
    REFUSE_IGNORE = "refuse, ignore"  # refused: a newer run of this task id owns the key
    REFUSE_REQUEUE = "refuse, requeue"  # refused, but nobody took over: run again
    REFUSE_WINNER = "refuse, winner's result"  # refused: another task id finished the key
    REFUSE_SUPERSEDED = "refuse, superseded"  # refused: another task id holds the key
    END_UNRUN = "end unrun"  # give the lease back and end without running (Ignore): nothing more to do


@dataclass(frozen=True)
class Facts:
    """What :func:`decide` needs besides the event and the view."""

    event: Event
    view: View = View.UNREAD
    joined: bool = False  # the run's writes were in its transaction: an uncommitted completion undid them
    delivered: bool = False  # the result backend already has this task id's ending (SUCCESS, FAILURE)
    deadline_passed: bool = False  # the run's local deadline passed: stop calling the store again
    read_failed: bool = False  # the store did not answer the read of the key
    wait_over: bool = False  # no use waiting for delivery: waited a ttl already (a header), or nothing tells
    marked: bool = False  # fence_mode="commit": this failed run marked the key failed, so its FAILURE ends it


# The answer for the events that never need a read.
_WITHOUT_READ = {
    Event.ACQUIRED: Action.RUN,
    Event.ACQUIRE_UNKNOWN: Action.WAIT_OUT,
    # Celery reported this task id FAILURE (its errback ran): a copy of it never runs the body again.
    Event.ENDED_BEFORE: Action.END_UNRUN,
    Event.RETURNED: Action.COMPLETE,
    Event.RETURNED_BLOCK_UNDONE: Action.COMPLETE,  # the body handled it: nothing else was lost
    Event.RETURNED_WORK_LOST: Action.REQUEUE,  # completing would commit half a run: run it all again
    # The body's own endings take Celery's course; the lease is released so the next attempt starts at once.
    # (A FAILURE is decided after a read: _failed.) Retry, Reject and Ignore send no errback.
    Event.RETRIED: Action.FAIL,
    Event.REJECTED: Action.FAIL,
    Event.IGNORED: Action.FAIL,
    Event.BODY_UNKNOWN: Action.REQUEUE,  # nothing of a failed transaction committed; a step did or not
    Event.COMPLETED: Action.SUCCEED,
    Event.COMPLETED_INTERRUPTED: Action.SUCCEED,  # committed: an interruption now cannot undo it
}

# A run refused (by the renewer, a fenced write, or its completion) ends by who has the key now.
_REFUSED = {
    View.UNREAD: Action.REQUEUE,  # unreadable: the copy will tell (the key done, or taken back)
    View.GONE: Action.REQUEUE,
    View.MINE_DONE: Action.RETURN_STORED,  # our own completion committed earlier
    View.MINE_HELD: Action.REFUSE_REQUEUE,  # the lease only lapsed: nobody took over
    View.MINE_FREE: Action.REFUSE_REQUEUE,
    View.HANDED_OFF: Action.REFUSE_REQUEUE,
    View.FREE: Action.REFUSE_REQUEUE,  # an admin release: nobody holds it, the work is still to do
    View.SAME_TASK: Action.REFUSE_IGNORE,  # the newer copy of this task id delivers the result
    View.SAME_TASK_DONE: Action.REFUSE_IGNORE,
    # The run that marked it delivers its FAILURE (or, if its worker stopped first, its message's redelivery
    # meets the mark and delivers it: FAILED_BEFORE)
    View.SAME_TASK_FAILED: Action.REFUSE_IGNORE,
    View.OTHER_TASK: Action.REFUSE_SUPERSEDED,
    View.OTHER_TASK_DONE: Action.REFUSE_WINNER,
}


def decide(facts: Facts) -> Action:
    """The next action of a run: a total function of :class:`Facts` (every combination has an answer)."""
    if facts.event in _WITHOUT_READ:
        return _WITHOUT_READ[facts.event]
    if facts.marked and facts.event in _FAILED:
        # The mark (made only on a key nobody finished or holds) refuses every copy's claim from now on:
        # this FAILURE is the task id's one ending.
        return Action.FAIL
    if facts.view is View.UNREAD and not facts.read_failed:
        return Action.READ
    return _AFTER_READ.get(facts.event, _completion)(facts)  # else COMPLETE_REFUSED or COMPLETE_UNKNOWN


def _finished(facts: Facts) -> Action:
    if facts.delivered:  # this task id's ending is stored: its callbacks or errback were sent; never again
        return Action.ABSORB
    if facts.view is View.UNREAD:  # unreadable: return what the acquire said
        return Action.RETURN_STORED
    if facts.view in (View.SAME_TASK_DONE, View.MINE_DONE):  # a copy of this very task id
        # Celery sends the callbacks, then stores SUCCESS, after the completion committed: the run that
        # committed may be doing so now. Silent for a ttl, it died before it delivered: deliver for it.
        return Action.RETURN_STORED if facts.wait_over else Action.AWAIT_DELIVERY
    if facts.view is View.OTHER_TASK_DONE:
        return Action.RETURN_STORED  # the winner's result is this task id's result too
    return Action.ACQUIRE_AGAIN  # pruned meanwhile


def _failed_before(facts: Facts) -> Action:
    """A run of this task id ended FAILURE and marked the key so (``fence_mode="commit"``). Celery stores
    that FAILURE right after the mark; silent for a ttl, the run's worker stopped in between: deliver it."""
    if facts.delivered:
        return Action.ABSORB
    if facts.view in (View.SAME_TASK_FAILED, View.UNREAD):
        return Action.DELIVER_FAILURE if facts.wait_over else Action.AWAIT_DELIVERY
    return Action.ACQUIRE_AGAIN  # the key changed between the begin and the read


def _held(facts: Facts) -> Action:
    view = facts.view
    if view is View.UNREAD:  # unreadable: whoever holds it, fence_on_busy decides
        return Action.BUSY
    if view is View.HANDED_OFF:
        return Action.TAKE_BACK
    if view is View.SAME_TASK:
        return Action.ABSORB_LATER
    if view is View.OTHER_TASK:
        return Action.BUSY
    return Action.ACQUIRE_AGAIN  # released, finished or pruned between the acquire and the read


def _completion(facts: Facts) -> Action:
    view = facts.view
    if view is View.UNREAD:  # unreadable: read again until the deadline, then let the copy find out
        return Action.REQUEUE if facts.deadline_passed else Action.READ
    if view is View.MINE_HELD and facts.event is Event.COMPLETE_UNKNOWN:
        # Not committed. A joined transaction rolled back with it: run again. Else the token is ours.
        if facts.joined or facts.deadline_passed:
            return Action.REQUEUE
        return Action.CALL_AGAIN
    return _refused(facts)  # mine done: committed, only the reply was lost (RETURN_STORED)


def _interrupted(facts: Facts) -> Action:
    """An interruption while the completion's reply was due: what the store holds says how the run ended."""
    if facts.view in (View.MINE_HELD, View.MINE_FREE):
        return Action.FAIL  # not committed: the interruption is how this run ended
    # Mine done: committed, SUCCESS whatever interrupted the reply (RETURN_STORED); unreadable: it may have
    # committed, so never FAILURE, the copy finds out (REQUEUE); anyone else's: as any refusal.
    return _refused(facts)


def _failed(facts: Facts) -> Action:
    """The body raised or was interrupted: Celery stores FAILURE and sends the errback, unless a copy of this
    very task id holds or finished the key (this run is a stale one): that copy's ending is the task id's,
    and a FAILURE now would run both branches of the canvas. Unreadable: the result backend tells whether
    its ending was delivered already, and if not, a copy is sent to find out."""
    if facts.view in (View.SAME_TASK, View.SAME_TASK_DONE, View.SAME_TASK_FAILED) or facts.delivered:
        return Action.ABSORB
    if facts.view is View.UNREAD:  # a copy of this task id may have taken the key over (an expiry, an admin
        return Action.REQUEUE  # release) and committed: a copy finds out; no FAILURE beside its SUCCESS
    return Action.FAIL  # ours, another task id's, or free


def _refused(facts: Facts) -> Action:
    """A refused run ends by who has the key now; another task id's finished key gives its result, unless
    this task id's ending is stored already (a copy of it returned that result: its link fired once)."""
    if facts.view is View.OTHER_TASK_DONE and facts.delivered:
        return Action.REFUSE_IGNORE
    return _REFUSED[facts.view]


_AFTER_READ = {
    Event.RAISED: _failed,
    Event.INTERRUPTED: _failed,
    Event.FINISHED: _finished,
    Event.FAILED_BEFORE: _failed_before,
    Event.HELD: _held,
    Event.REFUSED: _refused,
    Event.COMPLETE_INTERRUPTED: _interrupted,
}


_FAILED = (Event.RAISED, Event.INTERRUPTED)
_MINE_OR_A_COPYS = (
    View.MINE_DONE, View.MINE_HELD, View.MINE_FREE, View.SAME_TASK, View.SAME_TASK_DONE, View.SAME_TASK_FAILED
)


def asks_backend(event: Event, view: View) -> bool:
    """Whether deciding ``event`` on ``view`` needs the result backend's word (``Facts.delivered``: this
    task id's ending is stored). Only the slow paths ask, so a plain run never reads the backend."""
    if event in _FAILED:  # a failure on a key no longer this run's nor a copy's (moved on, or unreadable):
        return view not in _MINE_OR_A_COPYS  # did a copy of this task id end it already?
    if event is Event.FAILED_BEFORE:  # a marked key: was the FAILURE stored?
        return True
    if event is Event.FINISHED:  # a finished key (or unreadable): delivered yet, by whom?
        return view in (View.UNREAD, View.SAME_TASK_DONE, View.MINE_DONE, View.OTHER_TASK_DONE)
    return view is View.OTHER_TASK_DONE  # refused by a winner: did this task id return its result already?


def view_of(
    state: LeaseState | None,
    token: int,
    task_id: str,
    handoff: int | None = None,
    claimant: str | None = None,
) -> View:
    """Classify ``state`` for the run holding (or having asked for) ``token`` as task ``task_id``.

    ``handoff`` is the token of the attempt that re-queued this copy (its message header), if any.
    ``claimant``: the owner of a run of ``fence_mode="commit"``, which has no token until its claim draws
    one; the key's row names it once that claim committed (owners are unique per run), and its FAILURE's
    mark names it in the run record. A key another run of its task id marked failed is SAME_TASK_FAILED.
    """
    if state is None:
        return View.GONE
    if _is_mine(state, token, claimant):
        return _mine(state)
    if handoff is not None and state.token == handoff and not state.done and state.expires_in is not None:
        return View.HANDED_OFF
    same = _task_id(state.run) == task_id
    if state.done or (claimant is not None and same and state.dead is not None):
        return _ended(state, same)
    if state.expires_in is None:
        return View.FREE
    return View.SAME_TASK if same else View.OTHER_TASK


def _ended(state: LeaseState, same: bool) -> View:
    if not state.done:  # a fenced commit's FAILURE marked it
        return View.SAME_TASK_FAILED
    return View.SAME_TASK_DONE if same else View.OTHER_TASK_DONE


def _is_mine(state: LeaseState, token: int, claimant: str | None) -> bool:
    if claimant is None:
        return state.token == token
    # A fenced commit's run: its claim names it as the owner, its FAILURE's mark in the run record.
    return state.owner == claimant or (state.run or {}).get(ENDED_BY) == claimant


def _mine(state: LeaseState) -> View:
    if state.done:
        return View.MINE_DONE
    return View.MINE_HELD if state.expires_in is not None else View.MINE_FREE


def _task_id(run: Mapping[str, Any] | None) -> str | None:
    return None if not run else run.get("id")


def holder_of(state: LeaseState) -> str:
    """Who holds the key, for people: its owner and, when recorded, its task id."""
    task_id = (state.run or {}).get("id")
    return f"{state.owner} (task {task_id})" if task_id else str(state.owner)
