"""Running one program and reporting it: what a failing test prints, and how to replay it."""

from __future__ import annotations

import os
import re

from .checks import check
from .chooser import Chooser, Replay
from .sim import Simulator

__all__ = ["replay", "run_checked"]


def run_checked(
    sim: Simulator, chooser: Chooser, store: str, eager: bool = False, bare: bool = False
) -> None:
    """Run one program; on a broken invariant, fail with the program's steps and its replay line."""
    world = sim.run(chooser, eager=eager, bare=bare)
    problems = check(world)
    hunt = os.environ.get("FENCE_SIM_HUNT")  # only the problems matching it fail (finding one finding)
    problems = [p for p in problems if re.search(hunt, p)] if hunt else problems
    if problems:
        raise AssertionError(report(chooser, problems, store, eager, bare))


def report(chooser: Chooser, problems: list[str], store: str, eager: bool, bare: bool = False) -> str:
    mode = f"{store}{'-eager' if eager else ''}{'-bare' if bare else ''}"
    lines = ["invariants broken:", *(f"  - {p}" for p in problems), "program:", *chooser.lines]
    lines.append(f'replay: FENCE_SIM_REPLAY="{mode}:{chooser.program()}" '
                 ".venv/bin/pytest tests/simulation/test_replay.py -s")
    return "\n".join(lines)


def replay(sim: Simulator, spec: str) -> None:
    """Run the program printed as ``store[-eager]:numbers`` again on ``sim``."""
    mode, _, program = spec.partition(":")
    chooser = Replay(program)
    try:
        store, eager, bare = mode.split("-")[0], mode.endswith("-eager"), mode.endswith("-bare")
        run_checked(sim, chooser, store, eager=eager, bare=bare)
    finally:  # shown with -s, also when the invariants hold now
        print("\n".join(chooser.lines))
