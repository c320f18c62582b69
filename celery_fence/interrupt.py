"""Optional interruption of a run whose lease is lost (``fence_interrupt = True``).

Safety never depends on this: the store refuses a stale write whether or not the body stopped. It only
stops wasted work early. How a body is interrupted depends on where it runs:

- main thread (prefork and solo pools): a signal (``SIGUSR2``; billiard owns ``SIGUSR1``) delivered to the
  main thread, whose handler raises :class:`LeaseLost` (it interrupts ``time.sleep`` at once). The handler
  raises only while a run is armed, so a late signal cannot hit the worker's own loop.
- another thread (threads pool): an asynchronous exception, raised at the thread's next bytecode (after a
  blocking C call returns).
- gevent/eventlet: not supported (the thread id is a greenlet's); the body stops at its next ``check()``.
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
        self._lock = threading.Lock()
        self._installed = False

    def arm(self, fence: Any) -> int:
        ident = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            self._install_handler()
        with self._lock:
            self._armed[ident] = fence
        return ident

    def disarm(self, ident: int) -> None:
        with self._lock:
            self._armed.pop(ident, None)

    def fire(self, ident: int, fence: Any) -> None:
        with self._lock:
            if self._armed.get(ident) is not fence:
                return  # that run already left its body
        if ident == threading.main_thread().ident:
            signal.pthread_kill(ident, SIGNAL)
        else:
            exc = ctypes.py_object(LeaseLostInterrupt)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)

    def _install_handler(self) -> None:
        if not self._installed:
            signal.signal(SIGNAL, self._on_signal)
            self._installed = True

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        with self._lock:
            fence = self._armed.get(threading.get_ident())
        if fence is not None and fence.lost:
            raise LeaseLostInterrupt(fence.key, fence.token, f"lease lost: {fence.lost_reason}")
