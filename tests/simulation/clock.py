"""The simulation's one clock, and the one adapter that makes the run code use it (and, for the printed
program, one that reports the run's decisions).

Store time, the workers' monotonic time and wall time are one number here (``FakeClock``); a sleep moves it
at once. Main is being refactored so that ``FenceRuntime`` carries ``clock`` and ``sleep``: when
it does, :func:`install_clock` sets those; on older code it patches the ``time`` name of the modules that
read it directly (``run.py``, ``task.py``, ``fence.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from celery_fence import fence, run, task

__all__ = ["install_clock", "trace_decisions"]

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


def trace_decisions(say: Callable[[str], None]) -> Callable[[], None]:
    """Print each decision of the run's table that is not the plain path in the program (``run.decide``,
    where the run module names it; nothing otherwise). Returns the undo."""
    decide = getattr(run, "decide", None)
    if decide is None or getattr(decide, "traced", False):  # none, or traced already (another simulator)
        return lambda: None

    def traced(facts: Any) -> Any:
        action = decide(facts)
        plain = {("acquired", "run"), ("returned", "complete"), ("completed", "succeed")}
        names = (getattr(facts.event, "value", facts.event), getattr(action, "value", action))
        if names not in plain:
            view = getattr(facts, "view", None)
            say(f"    fence decides: {names[0]}, {getattr(view, 'value', view)} -> {names[1]}")
        return action

    traced.traced = True  # type: ignore[attr-defined]
    run.decide = traced  # type: ignore[attr-defined]

    def undo() -> None:
        run.decide = decide  # type: ignore[attr-defined]

    return undo
