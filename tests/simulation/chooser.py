"""Where a program's decisions come from: hypothesis while generating, a list of numbers when replaying.

Every decision is ``choose(label, options, weights)``; option 0 is always the plainest (answered, end,
return), which is what hypothesis shrinks toward. The decisions made are kept as numbers: that list is the
program, printed as ``replay("memory", "3.0.1...")``, and :class:`Replay` runs it again exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

__all__ = ["Chooser", "Drawn", "Replay", "Scripted"]

T = TypeVar("T")


class Chooser:
    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.lines: list[str] = []  # what happened, readable: the printed program

    def choose(self, label: str, options: Sequence[T], weights: Sequence[int] | None = None) -> T:
        weights = list(weights) if weights is not None else [1] * len(options)
        number = self._next(label, sum(weights)) if len(options) > 1 else 0
        if len(options) > 1:
            self.numbers.append(number)
        for option, weight in zip(options, weights, strict=True):
            if number < weight:
                return option
            number -= weight
        return options[-1]

    def say(self, line: str) -> None:
        self.lines.append(line)

    def program(self) -> str:
        return ".".join(map(str, self.numbers))

    def _next(self, label: str, total: int) -> int:
        raise NotImplementedError


class Drawn(Chooser):
    """Decisions drawn by hypothesis (``st.data()``)."""

    def __init__(self, data: Any) -> None:
        super().__init__()
        self.data = data

    def _next(self, label: str, total: int) -> int:
        return int(self.data.draw(st.integers(0, total - 1), label=label))


class Replay(Chooser):
    """Decisions read back from a printed program; past its end, always the plainest option."""

    def __init__(self, program: str) -> None:
        super().__init__()
        self._queue = [int(n) for n in program.split(".") if n.strip()]

    def _next(self, label: str, total: int) -> int:
        return min(self._queue.pop(0), total - 1) if self._queue else 0


class Scripted(Chooser):
    """Decisions named by label, for writing a program by hand (the minimal programs of the findings file):
    ``Scripted([("action", "deliver"), ("body op", "retry"), ...])``. Each entry is used by the next decision
    of that label, in order (its value, or a predicate on the options); every other decision takes option 0.
    ``program()`` is then the replay line of what ran."""

    def __init__(self, script: Sequence[tuple[str, Any]]) -> None:
        super().__init__()
        self.script = list(script)

    def choose(self, label: str, options: Sequence[T], weights: Sequence[int] | None = None) -> T:
        weights = list(weights) if weights is not None else [1] * len(options)
        index = 0
        if self.script and self.script[0][0] == label:
            want = self.script.pop(0)[1]
            index = next(i for i, option in enumerate(options) if _matches(want, option))
        if len(options) > 1:
            self.numbers.append(sum(weights[:index]))
        return options[index]


def _matches(want: Any, option: Any) -> bool:
    if callable(want):
        return bool(want(option))
    return bool(option == want or getattr(option, "id", None) == want)
