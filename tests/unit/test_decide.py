"""The run's decision table, exhaustively: every event x every view x every fact, with no worker.

Each property below is a promise of docs/guarantees.md (#the-guarantees, #how-a-run-ends) stated over the
whole table, so a row that breaks it fails here whatever its place; the named rows after them are the cases a
review found broken.
"""

from __future__ import annotations

import itertools

import pytest

from celery_fence._decide import Action, Event, Facts, View, asks_backend, decide, holder_of, view_of
from celery_fence.lease import ENDED_BY, LeaseState

# After the body: the events whose meaning depends on the key's state (BODY_UNKNOWN never does: nothing of a
# failed transaction committed, so it always runs again and the copy reads the key).
BODY_OR_LATER = {
    Event.REFUSED,
    Event.COMPLETE_REFUSED,
    Event.COMPLETE_UNKNOWN,
    Event.COMPLETE_INTERRUPTED,
}
# What the body and Celery did (docs/guarantees.md#every-exit). A FAILURE (raised, interrupted) is decided
# after a read: a stale run whose task id a copy carries on leaves the ending to that copy.
BODY_ENDINGS = {Event.RAISED, Event.RETRIED, Event.REJECTED, Event.IGNORED, Event.INTERRUPTED}
FAILURES = {Event.RAISED, Event.INTERRUPTED}
COPY_OF_THIS_TASK = {View.SAME_TASK, View.SAME_TASK_DONE, View.SAME_TASK_FAILED}
WITHOUT_READ = (BODY_ENDINGS - FAILURES) | {
    Event.ACQUIRED,
    Event.ACQUIRE_UNKNOWN,
    Event.ENDED_BEFORE,
    Event.RETURNED,
    Event.RETURNED_BLOCK_UNDONE,
    Event.RETURNED_WORK_LOST,
    Event.BODY_UNKNOWN,
    Event.COMPLETED,
    Event.COMPLETED_INTERRUPTED,
}
ENDS_THE_RUN_AGAIN = {Action.REQUEUE, Action.REFUSE_REQUEUE}
REFUSALS = {
    Action.REFUSE_IGNORE,
    Action.REFUSE_REQUEUE,
    Action.REFUSE_WINNER,
    Action.REFUSE_SUPERSEDED,
}
FLAGS = list(itertools.product([False, True], repeat=6))


def every_facts() -> list[Facts]:
    return [
        Facts(event, view, joined, delivered, deadline, read_failed, wait_over, marked)
        for event in Event
        for view in View
        for joined, delivered, deadline, read_failed, wait_over, marked in FLAGS
    ]


ALL = every_facts()


def test_the_table_is_total() -> None:
    for facts in ALL:
        assert isinstance(decide(facts), Action), facts


def test_a_run_reads_the_key_before_it_judges_an_ambiguous_outcome() -> None:
    for facts in ALL:
        marked_failure = facts.marked and facts.event in FAILURES  # its own mark decides: no read
        needs_read = facts.event not in WITHOUT_READ and not marked_failure
        if needs_read and facts.view is View.UNREAD and not facts.read_failed:
            assert decide(facts) is Action.READ, facts


def test_only_an_answered_completion_succeeds_with_the_bodys_own_result() -> None:
    for facts in ALL:
        if decide(facts) is Action.SUCCEED:
            assert facts.event in (Event.COMPLETED, Event.COMPLETED_INTERRUPTED), facts


def test_work_whose_completion_committed_is_never_run_again_nor_refused() -> None:
    """A committed completion whose reply was lost ends SUCCESS with its result."""
    for facts in ALL:
        if facts.view is View.MINE_DONE and facts.event in BODY_OR_LATER:
            assert decide(facts) is Action.RETURN_STORED, facts


def test_no_work_is_dropped_while_nobody_else_has_the_key() -> None:
    """Whenever the store shows no other run holding or having finished the key, the run ends by running
    again (or repeating its completion), never by a quiet Ignore; an interruption whose completion did not
    commit is the run's own failure (Celery stores FAILURE, the caller sees it)."""
    nobody_else = {View.MINE_HELD, View.MINE_FREE, View.FREE, View.GONE, View.HANDED_OFF}
    for facts in ALL:
        if facts.event in BODY_OR_LATER and facts.view in nobody_else:
            allowed = ENDS_THE_RUN_AGAIN | {Action.CALL_AGAIN}
            if facts.event is Event.COMPLETE_INTERRUPTED and facts.view in (View.MINE_HELD, View.MINE_FREE):
                allowed = {Action.FAIL}
            assert decide(facts) in allowed, facts


def test_a_committed_completion_is_never_reported_as_a_failure() -> None:
    """docs/guarantees.md#every-exit: an interruption (a time limit) while the reply is due or after it
    answered, or a lost reply, never turns a committed completion into FAILURE; an unreadable outcome is never
    FAILURE either."""
    for facts in ALL:
        action = decide(facts)
        after_completion = facts.event in BODY_OR_LATER and facts.view is View.MINE_DONE
        if after_completion or facts.event in (Event.COMPLETED, Event.COMPLETED_INTERRUPTED):
            assert action not in REFUSALS | {Action.FAIL}, facts
        if facts.event is Event.COMPLETE_INTERRUPTED and facts.read_failed and facts.view is View.UNREAD:
            assert action is Action.REQUEUE, facts
    assert decide(Facts(Event.COMPLETED_INTERRUPTED)) is Action.SUCCEED
    assert decide(Facts(Event.COMPLETE_INTERRUPTED, View.MINE_DONE)) is Action.RETURN_STORED


def test_the_bodys_own_endings_take_celerys_course() -> None:
    """Raised, retried, rejected, ignored or interrupted: release, and let Celery do what it does; but a
    FAILURE of a stale run whose task id a copy carries on (holds or finished the key) is absorbed, or both
    branches of the canvas would run (the simulation's soak found it); and one whose key cannot be read is
    sent again, so that a copy finds out whether a copy of it committed (N11). A fenced commit's FAILURE
    that marked the key is the task id's ending whatever the key shows."""
    for facts in ALL:
        read = facts.view is not View.UNREAD or facts.read_failed
        if facts.event in FAILURES and facts.marked:
            assert decide(facts) is Action.FAIL, facts
        elif facts.event in BODY_ENDINGS and (facts.event not in FAILURES or read):
            copy = facts.event in FAILURES and (facts.view in COPY_OF_THIS_TASK or facts.delivered)
            unknown = facts.event in FAILURES and facts.view is View.UNREAD
            expected = Action.ABSORB if copy else Action.REQUEUE if unknown else Action.FAIL
            assert decide(facts) is expected, facts
        if decide(facts) is Action.FAIL:
            assert facts.event in BODY_ENDINGS | {Event.COMPLETE_INTERRUPTED}, facts


def test_an_unreadable_key_after_the_body_is_sent_again_never_guessed() -> None:
    for facts in ALL:
        if facts.event in BODY_OR_LATER and facts.view is View.UNREAD and facts.read_failed:
            again = facts.deadline_passed or facts.event in (Event.REFUSED, Event.COMPLETE_INTERRUPTED)
            expected = {Action.REQUEUE} if again else {Action.READ}
            assert decide(facts) in expected, facts


def test_a_completion_is_repeated_only_on_its_own_unfinished_token_outside_a_transaction() -> None:
    """A joined transaction rolled back with an uncommitted completion: repeating the completion would
    commit a result without the writes, so the run runs again instead."""
    for facts in ALL:
        if decide(facts) is Action.CALL_AGAIN:
            assert facts.event is Event.COMPLETE_UNKNOWN and facts.view is View.MINE_HELD, facts
            assert not facts.joined and not facts.deadline_passed, facts


def test_a_refusal_is_only_ever_about_someone_else() -> None:
    for facts in ALL:
        action = decide(facts)
        if action in {Action.REFUSE_IGNORE, Action.REFUSE_WINNER, Action.REFUSE_SUPERSEDED}:
            assert facts.view in {
                View.SAME_TASK,
                View.SAME_TASK_DONE,
                View.SAME_TASK_FAILED,
                View.OTHER_TASK,
                View.OTHER_TASK_DONE,
            }, facts


def test_a_task_id_that_lost_its_key_to_another_ends_ready() -> None:
    """docs/guarantees.md#how-a-run-ends: the winner's result once the key is done, else a FenceError naming
    the winner."""
    for event in (Event.REFUSED, Event.COMPLETE_REFUSED, Event.COMPLETE_UNKNOWN):
        assert decide(Facts(event, View.OTHER_TASK_DONE)) is Action.REFUSE_WINNER
        assert decide(Facts(event, View.OTHER_TASK)) is Action.REFUSE_SUPERSEDED


def test_a_duplicate_of_a_delivered_result_does_not_deliver_it_again() -> None:
    """Canvas: Celery sends a task's callbacks before it stores SUCCESS; a copy that finds SUCCESS stored
    must not send the chain's next task or count a chord part again."""
    assert decide(Facts(Event.FINISHED, View.SAME_TASK_DONE, delivered=True)) is Action.ABSORB
    assert decide(Facts(Event.FINISHED, View.SAME_TASK_DONE, delivered=True, wait_over=True)) is Action.ABSORB
    assert decide(Facts(Event.FINISHED, View.OTHER_TASK_DONE, delivered=True)) is Action.ABSORB  # N1
    assert decide(Facts(Event.FINISHED, read_failed=True, delivered=True)) is Action.ABSORB  # N3


def test_a_copy_waits_a_ttl_for_a_finished_run_to_deliver_before_it_delivers_for_it() -> None:
    """Between the completion's commit and SUCCESS stored, the run that committed sends its callbacks: a
    copy finding the key finished but not delivered looks again a ttl later, and only then (the run died
    before it delivered) returns the stored result, so Celery sends the callbacks once either way."""
    for view in (View.SAME_TASK_DONE, View.MINE_DONE):
        assert decide(Facts(Event.FINISHED, view)) is Action.AWAIT_DELIVERY
        assert decide(Facts(Event.FINISHED, view, wait_over=True)) is Action.RETURN_STORED
    for facts in ALL:
        if decide(facts) is Action.AWAIT_DELIVERY:
            waits = facts.event in (Event.FINISHED, Event.FAILED_BEFORE)
            assert waits and not facts.delivered and not facts.wait_over, facts
    assert decide(Facts(Event.FINISHED, View.OTHER_TASK_DONE)) is Action.RETURN_STORED


def test_a_copy_that_meets_its_task_ids_failure_mark_waits_then_delivers_that_failure() -> None:
    """fence_mode="commit": a run that ended FAILURE marked the key, then Celery stores the FAILURE. A copy
    sent later (a redelivery of that very run's message when its worker stopped in between) absorbs itself
    once the FAILURE is stored, looks again a ttl later while it is not, and then ends with that FAILURE:
    never quietly with no ending stored (the soak's PENDING task), never by running the body again."""
    for view in (View.SAME_TASK_FAILED, View.UNREAD):
        read_failed = view is View.UNREAD
        assert decide(Facts(Event.FAILED_BEFORE, view, read_failed=read_failed)) is Action.AWAIT_DELIVERY
        assert decide(Facts(Event.FAILED_BEFORE, view, read_failed=read_failed, wait_over=True)) is (
            Action.DELIVER_FAILURE
        )
    for facts in ALL:
        action = decide(facts)
        if action is Action.DELIVER_FAILURE:
            assert facts.event is Event.FAILED_BEFORE and not facts.delivered and facts.wait_over, facts
        if facts.event is Event.FAILED_BEFORE and facts.delivered:
            assert action in (Action.ABSORB, Action.READ), facts
        if facts.event is Event.FAILED_BEFORE:
            assert action not in (Action.RUN, Action.SUCCEED, Action.RETURN_STORED), facts


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        (Facts(Event.HELD, View.HANDED_OFF), Action.TAKE_BACK),  # held by the attempt that sent this copy
        (Facts(Event.HELD, View.SAME_TASK), Action.ABSORB_LATER),  # a copy, whatever the key
        (Facts(Event.HELD, View.OTHER_TASK), Action.BUSY),
        (Facts(Event.HELD, View.FREE), Action.ACQUIRE_AGAIN),
        (Facts(Event.REFUSED, View.FREE), Action.REFUSE_REQUEUE),  # an admin release: redo the work
        (Facts(Event.REFUSED, View.MINE_HELD), Action.REFUSE_REQUEUE),  # only lapsed
        (Facts(Event.COMPLETE_UNKNOWN, View.MINE_HELD), Action.CALL_AGAIN),
        (Facts(Event.COMPLETE_UNKNOWN, View.MINE_HELD, joined=True), Action.REQUEUE),
        (Facts(Event.COMPLETE_UNKNOWN, View.MINE_DONE, joined=True), Action.RETURN_STORED),
        (Facts(Event.BODY_UNKNOWN), Action.REQUEUE),
        (Facts(Event.RAISED), Action.READ),  # a FAILURE is decided once the key is read
        (Facts(Event.RAISED, View.MINE_HELD), Action.FAIL),
        (Facts(Event.RAISED, read_failed=True), Action.REQUEUE),  # unreadable: a copy finds out (N11)
        (Facts(Event.RAISED, read_failed=True, delivered=True), Action.ABSORB),  # a copy delivered it
        (Facts(Event.RAISED, View.SAME_TASK_DONE), Action.ABSORB),  # the soak's both branches
        (Facts(Event.INTERRUPTED, View.SAME_TASK), Action.ABSORB),
        (Facts(Event.RAISED, View.OTHER_TASK_DONE), Action.FAIL),  # another task id's ending is not ours
        (Facts(Event.COMPLETE_REFUSED, View.OTHER_TASK_DONE), Action.REFUSE_WINNER),
        # ... once: a copy of this task id returned the winner's result already (its link fired)
        (Facts(Event.COMPLETE_REFUSED, View.OTHER_TASK_DONE, delivered=True), Action.REFUSE_IGNORE),
        (Facts(Event.REFUSED, View.OTHER_TASK_DONE, delivered=True), Action.REFUSE_IGNORE),
        (Facts(Event.RETURNED_BLOCK_UNDONE), Action.COMPLETE),  # the body caught its block's error
        (Facts(Event.RETURNED_WORK_LOST), Action.REQUEUE),
        (Facts(Event.COMPLETE_INTERRUPTED, View.MINE_DONE), Action.RETURN_STORED),  # finding 2
        (Facts(Event.COMPLETE_INTERRUPTED, View.MINE_HELD), Action.FAIL),
        (Facts(Event.COMPLETE_INTERRUPTED, read_failed=True), Action.REQUEUE),
        (Facts(Event.COMPLETED_INTERRUPTED), Action.SUCCEED),
        (Facts(Event.ENDED_BEFORE), Action.END_UNRUN),  # finding 4
        # fence_mode="commit": the FAILURE that marked the key ends the task id; a copy beside it is quiet
        (Facts(Event.RAISED, marked=True), Action.FAIL),
        (Facts(Event.INTERRUPTED, View.SAME_TASK_DONE, marked=True), Action.FAIL),
        (Facts(Event.RAISED, View.SAME_TASK_FAILED), Action.ABSORB),  # another copy's mark came first
        (Facts(Event.COMPLETE_REFUSED, View.SAME_TASK_FAILED), Action.REFUSE_IGNORE),
        (Facts(Event.FAILED_BEFORE), Action.READ),
        (Facts(Event.FAILED_BEFORE, View.FREE), Action.ACQUIRE_AGAIN),  # changed since the begin
    ],
)
def test_each_named_event_and_view_decides_its_action(facts: Facts, action: Action) -> None:
    assert decide(facts) is action


def state(token: int, *, done: bool = False, held: bool = True, task: str | None = "t") -> LeaseState:
    run = None if task is None else {"id": task}
    return LeaseState("k", token, "o", 1.0 if held else None, done, None, None, run=run)


@pytest.mark.parametrize(
    ("seen", "view"),
    [
        (None, View.GONE),
        (state(5, done=True, held=False), View.MINE_DONE),
        (state(5), View.MINE_HELD),
        (state(5, held=False), View.MINE_FREE),
        (state(4), View.HANDED_OFF),
        (state(4, done=True, held=False), View.SAME_TASK_DONE),
        (state(6), View.SAME_TASK),
        (state(6, task="other"), View.OTHER_TASK),
        (state(6, done=True, held=False, task="other"), View.OTHER_TASK_DONE),
        (state(6, held=False, task=None), View.FREE),
        (state(6, task=None), View.OTHER_TASK),  # a holder that recorded nothing is not us
    ],
)
def test_the_lease_state_read_is_seen_as_its_view_for_this_run(seen: LeaseState | None, view: View) -> None:
    assert view_of(seen, token=5, task_id="t", handoff=4) is view


def marked(by: str, task: str = "t") -> LeaseState:
    """A key a fenced commit's FAILURE marked (``strand``): dead, free, its run record naming the run."""
    return LeaseState("k", 0, None, None, False, None, "t ended FAILURE", run={"id": task, ENDED_BY: by})


@pytest.mark.parametrize(
    ("seen", "view"),
    [
        (marked(by="me"), View.MINE_FREE),  # its own mark, whose reply was lost
        (marked(by="copy"), View.SAME_TASK_FAILED),
        (marked(by="copy", task="other"), View.FREE),  # another task id's FAILURE ends nothing of ours
        (LeaseState("k", 7, "me", None, True, 1, None, run={"id": "t"}), View.MINE_DONE),  # its claim
        (LeaseState("k", 7, "copy", None, True, 1, None, run={"id": "t"}), View.SAME_TASK_DONE),
    ],
)
def test_a_fenced_commits_run_knows_its_claim_and_its_mark_by_its_owner(seen: LeaseState, view: View) -> None:
    assert view_of(seen, token=0, task_id="t", claimant="me") is view
    if view is View.SAME_TASK_FAILED:  # a lease mode run does not read a mark so
        assert view_of(seen, token=9, task_id="t") is View.FREE


def test_only_the_slow_paths_ask_the_result_backend() -> None:
    """The backend is read for a finished key (or one that cannot be read), a refusal by a winner of
    another task id, and a failure on a key that is no longer this run's nor a copy's; never on a plain
    run."""
    failed_elsewhere = {
        View.UNREAD, View.GONE, View.HANDED_OFF, View.OTHER_TASK, View.OTHER_TASK_DONE, View.FREE
    }
    expected = {(event, view) for event in (Event.RAISED, Event.INTERRUPTED) for view in failed_elsewhere}
    expected |= {(Event.FINISHED, view) for view in
                 (View.UNREAD, View.SAME_TASK_DONE, View.MINE_DONE, View.OTHER_TASK_DONE)}
    expected |= {(event, View.OTHER_TASK_DONE) for event in Event}
    expected |= {(Event.FAILED_BEFORE, view) for view in View}  # a mark: was its FAILURE stored?
    assert {(event, view) for event in Event for view in View if asks_backend(event, view)} == expected


def test_the_holder_is_named_by_its_owner_and_its_task_id_when_recorded() -> None:
    held = LeaseState("k", 3, "host:1:abc-1", 12.0, False, run={"id": "t-9"})
    assert holder_of(held) == "host:1:abc-1 (task t-9)"
    assert holder_of(LeaseState("k", 3, "host:1:abc-1", 12.0, False)) == "host:1:abc-1"
