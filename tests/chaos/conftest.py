"""The chaos layer reuses the integration world (real workers, a Redis broker, every lease store)."""

from __future__ import annotations

from tests.integration.world import cluster

__all__ = ["cluster"]
