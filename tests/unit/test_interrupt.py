"""fence_interrupt's two routes, without a worker: a signal to the main thread, an async exception to
another thread. Both raise only while the run is armed."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from celery_fence import LeaseLost
from celery_fence.fence import Fence
from celery_fence.interrupt import Interrupter
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
