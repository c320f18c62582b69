"""The deterministic simulation of the real run: hypothesis generates programs, the real
FencedTask/Run code runs them through Celery's tracer on a simulated broker, and the invariants of
docs/guarantees.md (the guarantees, how a run ends) are checked after each (``checks.py``). A failure prints
the program and its replay line.

``make test`` runs the short form (derandomized: the same programs every run); ``make soak-sim`` (part of
``make soak``) the random soak, ``FENCE_SIM_PROGRAMS`` programs on the memory store (default 200,000) through
the tracer, as many without it (``bare.py``), and a tenth of that on SQLite. ``fence_mode="commit"`` runs as a
mode of its own (``*_commit_sim``): on the memory store (emulated: its claim, no transaction), SQLite and
PostgreSQL; its soak runs half the memory programs and a twentieth on SQLite. On PostgreSQL the soak runs a
thousandth in each mode (its driver keeps prepared statements per connection: programs one after the other
on one store found a way to lose them; more would take long, as each jump of the clock moves every stored
expiry).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .chooser import Drawn
from .runner import run_checked
from .sim import Simulator

SOAK = int(os.environ.get("FENCE_SIM_PROGRAMS", "200000"))


def short(examples: int) -> Any:
    return settings(
        max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


def soak(examples: int) -> Any:
    return settings(
        max_examples=examples, deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


@short(2000)
@given(data=st.data())
def test_programs_on_the_memory_store(memory_sim: Simulator, data: Any) -> None:
    run_checked(memory_sim, Drawn(data), "memory")


@short(2000)
@given(data=st.data())
def test_programs_without_celery(memory_sim: Simulator, data: Any) -> None:
    """``Run`` through a fake host (bare.py): the same programs and checks, without Celery's tracer."""
    run_checked(memory_sim, Drawn(data), "memory", bare=True)


@short(200)
@given(data=st.data())
def test_programs_through_eager_apply(memory_sim: Simulator, data: Any) -> None:
    run_checked(memory_sim, Drawn(data), "memory", eager=True)


@short(60)
@given(data=st.data())
def test_programs_on_sqlite(sqlite_sim: Simulator, data: Any) -> None:
    run_checked(sqlite_sim, Drawn(data), "sqlite")


@short(30)
@given(data=st.data())
def test_programs_through_eager_apply_on_sqlite(sqlite_sim: Simulator, data: Any) -> None:
    run_checked(sqlite_sim, Drawn(data), "sqlite", eager=True)


@short(20)
@given(data=st.data())
def test_programs_on_postgresql(postgresql_sim: Simulator, data: Any) -> None:
    run_checked(postgresql_sim, Drawn(data), "postgresql")


# fence_mode="commit": no lease, the key claimed by the run's completion (docs/commit-mode.md). The memory
# store emulates it (an atomic claim, no transaction: its writes are not checked); SQLite fences the writes.


@short(300)
@given(data=st.data())
def test_commit_mode_programs_on_the_memory_store(memory_commit_sim: Simulator, data: Any) -> None:
    run_checked(memory_commit_sim, Drawn(data), "memory_commit")


@short(300)
@given(data=st.data())
def test_commit_mode_programs_without_celery(memory_commit_sim: Simulator, data: Any) -> None:
    run_checked(memory_commit_sim, Drawn(data), "memory_commit", bare=True)


@short(100)
@given(data=st.data())
def test_commit_mode_programs_through_eager_apply(memory_commit_sim: Simulator, data: Any) -> None:
    run_checked(memory_commit_sim, Drawn(data), "memory_commit", eager=True)


@short(60)
@given(data=st.data())
def test_commit_mode_programs_on_sqlite(sqlite_commit_sim: Simulator, data: Any) -> None:
    run_checked(sqlite_commit_sim, Drawn(data), "sqlite_commit")


@short(20)
@given(data=st.data())
def test_commit_mode_programs_on_postgresql(postgresql_commit_sim: Simulator, data: Any) -> None:
    """Where copies run at once: a nested copy's claim may come first, and the outer one's is refused."""
    run_checked(postgresql_commit_sim, Drawn(data), "postgresql_commit")


@pytest.mark.soak
@soak(SOAK)
@given(data=st.data())
def test_soak_on_the_memory_store(memory_sim: Simulator, data: Any) -> None:
    run_checked(memory_sim, Drawn(data), "memory")


@pytest.mark.soak
@soak(SOAK)
@given(data=st.data())
def test_soak_without_celery(memory_sim: Simulator, data: Any) -> None:
    run_checked(memory_sim, Drawn(data), "memory", bare=True)


@pytest.mark.soak
@soak(max(1, SOAK // 10))
@given(data=st.data())
def test_soak_on_sqlite(sqlite_sim: Simulator, data: Any) -> None:
    run_checked(sqlite_sim, Drawn(data), "sqlite")


@pytest.mark.soak
@soak(max(1, SOAK // 1000))
@given(data=st.data())
def test_soak_on_postgresql(postgresql_sim: Simulator, data: Any) -> None:
    """PostgreSQL's driver keeps state per connection (its prepared statements): programs one after the
    other on one store, as a worker's runs are."""
    run_checked(postgresql_sim, Drawn(data), "postgresql")


@pytest.mark.soak
@soak(max(1, SOAK // 1000))
@given(data=st.data())
def test_soak_commit_mode_on_postgresql(postgresql_commit_sim: Simulator, data: Any) -> None:
    run_checked(postgresql_commit_sim, Drawn(data), "postgresql_commit")


@pytest.mark.soak
@soak(SOAK // 2)
@given(data=st.data())
def test_soak_commit_mode_on_the_memory_store(memory_commit_sim: Simulator, data: Any) -> None:
    run_checked(memory_commit_sim, Drawn(data), "memory_commit")


@pytest.mark.soak
@soak(max(1, SOAK // 20))
@given(data=st.data())
def test_soak_commit_mode_on_sqlite(sqlite_commit_sim: Simulator, data: Any) -> None:
    run_checked(sqlite_commit_sim, Drawn(data), "sqlite_commit")
