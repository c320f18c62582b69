"""fence_interrupt's two routes, without a worker: a signal to the main thread, an async exception to
another thread. Both raise only while the run is armed."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator

import pytest

from celery_fence import LeaseLost
from celery_fence._interrupt import Interrupter
from celery_fence.fence import Fence
from celery_fence.stores.memory import MemoryStore


@pytest.fixture(autouse=True)
def _restore_signal_handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, previous)


def _fence() -> Fence:
    store = MemoryStore()
    return Fence(store, store.acquire("k", "w", 30.0))


def test_a_lost_lease_interrupts_the_main_thread() -> None:
    interrupter, fence = Interrupter(), _fence()
    ident = interrupter.arm(fence)
    fence.mark_lost("renew refused")
    with pytest.raises(LeaseLost, match="renew refused"):
        interrupter.fire(ident, fence)
        for _ in range(10_000_000):  # the handler raises between two bytecodes
            pass
    interrupter.disarm(ident)


def test_a_disarmed_run_is_never_interrupted() -> None:
    interrupter, fence = Interrupter(), _fence()
    ident = interrupter.arm(fence)
    interrupter.disarm(ident)
    fence.mark_lost("late")
    interrupter.fire(ident, fence)  # the run already left its body: nothing happens


def test_a_lost_lease_interrupts_a_pool_thread() -> None:
    interrupter, fence, armed, outcome = Interrupter(), _fence(), threading.Event(), {}

    def body() -> None:
        ident = interrupter.arm(fence)
        outcome["ident"] = ident
        armed.set()
        try:
            while True:  # a busy body: the exception lands at its next bytecode
                pass
        except LeaseLost as exc:
            outcome["raised"] = exc
        finally:
            interrupter.disarm(ident)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert armed.wait(5)
    fence.mark_lost("taken over")
    interrupter.fire(outcome["ident"], fence)
    thread.join(10)
    assert not thread.is_alive() and isinstance(outcome.get("raised"), LeaseLost)


def test_a_run_is_interrupted_once_per_arming() -> None:
    """The interruption may land inside disarm() before it unarms (CI saw it); a second one fired then would
    land after the body was left. So a run is interrupted once, as Celery raises SoftTimeLimitExceeded once:
    a body that swallows the first runs on to its next check()."""
    interrupter, fence, interrupts = Interrupter(), _fence(), []
    armed, caught, fired_again = threading.Event(), threading.Event(), threading.Event()
    fence.mark_lost("taken over")

    def body() -> None:  # every spin inside the try: an asynchronous exception lands at a loop's back jump
        ident, spins, done = None, 0, False
        while not done:
            try:
                if ident is None:
                    ident = interrupter.arm(fence)
                    armed.set()
                while spins < 100_000:
                    if fired_again.is_set():
                        spins += 1  # still armed: a second interruption would land here
                    sum(range(20))
                done = True
            except LeaseLost as exc:
                interrupts.append(exc)
                caught.set()
        assert ident is not None
        interrupter.disarm(ident)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert armed.wait(10)
    interrupter.fire(thread.ident or 0, fence)
    assert caught.wait(10)
    interrupter.fire(thread.ident or 0, fence)
    fired_again.set()
    thread.join(10)
    assert not thread.is_alive() and len(interrupts) == 1, interrupts


def test_an_interrupt_never_lands_after_the_body_was_left() -> None:
    """The threads pool's async exception never lands after the run left its body (in the completion, the
    tracer, the next task): fired without pause against a thread that arms and disarms without pause, it
    lands inside the body or not at all."""
    interrupter, fence = Interrupter(), _fence()
    fence.mark_lost("taken over")
    current: dict[str, int] = {}
    stop, counts = threading.Event(), {"inside": 0, "outside": 0}

    def pool_thread() -> None:
        try:
            for _ in range(100_000):
                try:
                    ident = current["ident"] = threading.get_ident()
                    try:  # the run's own handling: arming, the body, and its disarm on the way out
                        try:
                            interrupter.arm(fence)
                            sum(range(20))
                        finally:
                            interrupter.disarm(ident)
                    except LeaseLost:
                        counts["inside"] += 1
                    sum(range(20))  # after the body: the completion, the tracer, the next task
                except LeaseLost:
                    counts["outside"] += 1
        except LeaseLost:  # landed on the loop's back jump, also after the body
            counts["outside"] += 1
        finally:
            stop.set()

    def renewer_thread() -> None:
        while not stop.is_set():
            ident = current.get("ident")
            if ident is not None:
                interrupter.fire(ident, fence)

    threads = [threading.Thread(target=pool_thread), threading.Thread(target=renewer_thread)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: the races show
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert counts["outside"] == 0, counts
    assert counts["inside"] > 0, counts  # the interrupts did fire
