"""The ``cluster`` fixture: one test's world of real workers (tests/integration/world.py)."""

from __future__ import annotations

from .world import cluster

__all__ = ["cluster"]
