"""A test that needs a server it cannot reach is skipped on a developer's machine and fails in CI (``CI``
set to anything but empty, ``0`` or ``false``), so a missing service never passes quietly."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set to a true value."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def require_server(name: str, available: bool, reason: str) -> None:
    """Do nothing if ``available``; otherwise fail in CI and skip elsewhere."""
    if available:
        return
    message = f"{name} is not available: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI is set, so a missing server is an error)", pytrace=False)
    pytest.skip(message)
