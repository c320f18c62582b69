"""The store-harness fixtures (tests/support/harness_fixtures.py); a test module overrides ``harness`` to
choose its stores."""

from __future__ import annotations

from tests.support.harness_fixtures import expire, fence_contract_harness, harness, store

__all__ = ["expire", "fence_contract_harness", "harness", "store"]
