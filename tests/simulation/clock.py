"""The simulation's one clock, and the one adapter that makes the run code use it.

Store time, the workers' monotonic time and wall time are one number here (``FakeClock``); a sleep moves it
at once. Main is being refactored so that ``FenceRuntime`` carries ``clock`` and ``sleep`` (issue 25): when
it does, :func:`install_clock` sets those; on older code it patches the ``time`` name of the modules that
read it directly (``run.py``, ``task.py``, ``fence.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from celery_fence import fence, run, task

__all__ = ["install_clock"]

_MODULES = (run, task, fence)


def install_clock(
    runtime: Any, now: Callable[[], float], sleep: Callable[[float], None]
) -> Callable[[], None]:
    """Make the run code read ``now`` and sleep through ``sleep``; returns the undo."""
    if hasattr(runtime, "clock") and hasattr(runtime, "sleep"):
        before = runtime.clock, runtime.sleep
        runtime.clock, runtime.sleep = now, sleep

        def undo_runtime() -> None:
            runtime.clock, runtime.sleep = before

        return undo_runtime
    shim = SimpleNamespace(monotonic=now, time=now, sleep=sleep)
    saved = [(module, module.time) for module in _MODULES if hasattr(module, "time")]
    for module, _ in saved:
        module.time = shim  # type: ignore[attr-defined]

    def undo_modules() -> None:
        for module, original in saved:
            module.time = original  # type: ignore[attr-defined]

    return undo_modules
