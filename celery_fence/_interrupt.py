"""Optional interruption of a run whose lease is lost (``fence_interrupt = True``).

Safety never depends on this: the store refuses a stale write whether or not the body stopped. It only
stops wasted work early. How a body is interrupted depends on where it runs:

- main thread (prefork and solo pools): a signal (``SIGUSR2``; billiard owns ``SIGUSR1``) delivered to the
  main thread, whose handler raises :class:`LeaseLost` (it interrupts ``time.sleep`` at once). The handler
  raises only while a run is armed, so a late signal cannot hit the worker's own loop.
- another thread (threads pool): an asynchronous exception, raised at the thread's next bytecode (after a
  blocking C call returns).
- gevent/eventlet: not supported (the thread id is a greenlet's); the body stops at its next ``check()``.

An interruption never outlives the run's body: ``fire`` sets it under the same lock that ``disarm`` takes,
and ``disarm`` cancels an asynchronous exception still pending for its thread, so none can land in the
completion, Celery's tracer or the next task. A run is interrupted at most once per arming (as Celery raises
``SoftTimeLimitExceeded`` once): the interruption may land inside ``disarm`` before it unarms, and a second
one could then land after the body was left.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
from types import FrameType
from typing import Any

from .errors import LeaseLost

__all__ = ["Interrupter", "LeaseLostInterrupt"]

log = logging.getLogger(__name__)
SIGNAL = signal.SIGUSR2


class LeaseLostInterrupt(LeaseLost):
    """The :class:`LeaseLost` raised into an interrupted body (built without arguments)."""

    def __init__(self, key: str = "?", token: int = 0, reason: str = "lease lost: run interrupted") -> None:
        super().__init__(key, token, reason)


class Interrupter:
    """Arms one run at a time per thread; ``fire`` interrupts the armed run of a thread."""

    def __init__(self) -> None:
        self._armed: dict[int, Any] = {}  # thread ident -> the armed run's fence
        self._fired: set[int] = set()  # threads interrupted during their current arming
        self._lock = threading.RLock()  # the signal handler may run in a thread that holds it
        self._installed = False

    def arm(self, fence: Any) -> int:
        ident = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            self._install_handler()
        with self._lock:
            self._armed[ident] = fence
            # The last arming's interruption was either raised or cancelled by its disarm: none is pending.
            self._fired.discard(ident)
        return ident

    def disarm(self, ident: int) -> None:
        """Called by the run's own thread as it leaves the body; afterwards nothing is raised into it."""
        with self._lock:
            self._armed.pop(ident, None)
            if ident in self._fired:  # set but maybe not raised yet: cancel it (a no-op after a signal)
                self._fired.discard(ident)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)

    def fire(self, ident: int, fence: Any) -> None:
        with self._lock:  # held across the raise, so disarm cannot slip in between the check and it
            if self._armed.get(ident) is not fence or ident in self._fired:
                return  # that run already left its body, or was interrupted once already
            self._fired.add(ident)
            if ident == threading.main_thread().ident:
                signal.pthread_kill(ident, SIGNAL)  # the handler checks the armed run under this lock
            else:
                exc = ctypes.py_object(LeaseLostInterrupt)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)

    def fire_for(self, fence: Any) -> None:
        """Interrupt the thread whose armed run is ``fence`` (nothing if it is not armed)."""
        with self._lock:
            idents = [ident for ident, armed in self._armed.items() if armed is fence]
            for ident in idents:
                self.fire(ident, fence)

    def _install_handler(self) -> None:
        if not self._installed:
            signal.signal(SIGNAL, self._on_signal)
            self._installed = True

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        with self._lock:
            fence = self._armed.get(threading.get_ident())
        if fence is not None and fence.lost:
            raise LeaseLostInterrupt(fence.key, fence.token, f"lease lost: {fence.lost_reason}")
