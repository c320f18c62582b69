"""Simulators for the simulation tests: the memory store (new per program), SQLite (a file in a temp dir)
and PostgreSQL (a schema of its own on the ``postgres_url`` database); ``*_commit_sim``: the same with
``fence_mode="commit"`` (memory: emulated)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from celery_fence.stores import open_store
from tests.support.harnesses.sql import pg_schema_store

from .sim import Simulator

# test_replay.py replays one printed program: a tool, collected only when FENCE_SIM_REPLAY names one (never a
# test that skips in CI).
collect_ignore = [] if os.environ.get("FENCE_SIM_REPLAY") else ["test_replay.py"]


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """The run code logs every fault it meets: thousands of programs would flood the output."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def memory_sim() -> Iterator[Simulator]:
    sim = Simulator()
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def sqlite_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('sim') / 'fence.db'}")
    sim = Simulator(store)
    yield sim
    sim.close()
    store.close()


@pytest.fixture(scope="module")
def postgresql_sim(postgres_url: str) -> Iterator[Simulator]:
    with pg_schema_store(postgres_url) as store:
        sim = Simulator(store)
        yield sim
        sim.close()


@pytest.fixture(scope="module")
def memory_commit_sim() -> Iterator[Simulator]:
    sim = Simulator(mode="commit")
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def sqlite_commit_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('sim') / 'fence.db'}")
    sim = Simulator(store, mode="commit")
    yield sim
    sim.close()
    store.close()


@pytest.fixture(scope="module")
def postgresql_commit_sim(postgres_url: str) -> Iterator[Simulator]:
    with pg_schema_store(postgres_url) as store:
        sim = Simulator(store, mode="commit")
        yield sim
        sim.close()
