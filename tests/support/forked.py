"""One attempt in a process of its own, forked, so that it may die the way a worker does (SIGKILL)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def exit_code_of(target: Callable[..., None], *args: Any) -> int | None:
    """Run ``target(*args)`` in a forked process; its exit code (``-SIGKILL`` when it killed itself)."""
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    process.join(60)
    return process.exitcode
