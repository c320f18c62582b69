"""The renewer's thread itself (started for real, over a memory store and a fake monotonic clock): whatever
ends it is reported, every tracked lease is reported lost, and a new thread takes over at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence._runtime import Renewer
from celery_fence.lease import Lease, LeasePolicy
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock, wait_for

POLICY = LeasePolicy(ttl=60.0, renew_interval=0.02)


@pytest.fixture
def renewer() -> Iterator[Renewer]:
    mono = FakeClock(start=0.0)
    renewer = Renewer(MemoryStore(clock=FakeClock()), 0.02, clock=mono)
    yield renewer
    renewer.stop()


def _track(renewer: Renewer, key: str, lost: list[tuple[str, str]], on_renewed: Any = None) -> Lease:
    lease = renewer.store.acquire(key, "me", POLICY.ttl)
    renewer.track(lease, POLICY, 0.0, lambda x, why: lost.append((x.key, why)), on_renewed)
    return lease


def _exit(_: Lease) -> None:
    raise SystemExit("a callback called sys.exit()")


def test_a_thread_killed_by_system_exit_reports_every_lease_lost_and_is_replaced_at_once(
    renewer: Renewer, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[tuple[str, str]] = []
    _track(renewer, "quiet", lost)
    _track(renewer, "exits", lost, on_renewed=_exit)
    first = renewer._thread
    assert isinstance(renewer.clock, FakeClock)
    renewer.clock.advance(1.0)  # both leases are due: the next pass renews them and the callback exits
    wait_for(lambda: len(lost) == 2, 10, "both leases reported lost")
    assert {key for key, _ in lost} == {"quiet", "exits"}
    assert all("SystemExit" in why and "a callback called sys.exit()" in why for _, why in lost)
    wait_for(lambda: renewer.restarts == 1 and renewer._thread is not first, 10, "a new thread")
    assert renewer._thread is not None and renewer._thread.is_alive()
    assert any(r.levelno == logging.CRITICAL and "renewer" in r.getMessage() for r in caplog.records)
    renewed: list[str] = []
    _track(renewer, "after", lost, on_renewed=lambda x: renewed.append(x.key))
    renewer.clock.advance(1.0)
    wait_for(lambda: renewed, 10, "the new thread to renew")  # it keeps renewing
    assert renewer.held() == [Lease("after", renewer.store.get("after").token, "me")]


def test_a_dead_thread_is_restarted_by_the_watchdog_in_deadline(renewer: Renewer) -> None:
    lease = _track(renewer, "k", [])
    renewer.stop()  # end the real one cleanly, then pretend it died without a word
    assert renewer._thread is not None
    renewer._thread.join(5)
    renewer._stopping = False
    renewer._wake.clear()
    dead = renewer._thread
    assert not dead.is_alive()
    renewer.deadline(lease)  # every self.fence.check() asks this
    assert renewer._thread is not dead and renewer._thread is not None and renewer._thread.is_alive()
    assert renewer.restarts == 1


def test_stop_ends_the_thread_without_reporting_or_restarting(renewer: Renewer) -> None:
    lost: list[tuple[str, str]] = []
    _track(renewer, "k", lost)
    thread = renewer._thread
    renewer.stop()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and renewer._thread is thread
    assert (lost, renewer.restarts) == ([], 0)


def test_a_stop_from_another_thread_while_the_thread_is_being_started_joins_only_a_started_one(
    renewer: Renewer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop()`` (a worker shutting down, a test's teardown) may come at any moment, from any thread: it
    never meets a thread created but not yet started, which ``join`` refuses with ``RuntimeError``."""
    errors: list[BaseException] = []
    real_start = threading.Thread.start

    def stop_in_between(thread: threading.Thread) -> None:
        if thread.name == "celery-fence-renewer":  # created, not started yet: another thread stops now
            def stop() -> None:
                try:
                    renewer.stop()
                except BaseException as exc:
                    errors.append(exc)

            stopper = threading.Thread(target=stop)
            real_start(stopper)
            stopper.join()
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", stop_in_between)
    _track(renewer, "k", [])  # starts the thread
    assert errors == []
