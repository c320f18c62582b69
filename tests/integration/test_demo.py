"""``make demo`` in CI: the story on the embedded default, its exit code checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .workers import ROOT

pytestmark = pytest.mark.integration


def test_the_demo_holds_every_invariant(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCE_", "CELERY_"))}
    env.update(FENCE_DEMO_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "example_app", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    assert "all invariants hold" in done.stdout
    assert "violations found by verify     0" in done.stdout
    assert "stale writes refused           0" not in done.stdout  # the pause fault really happened
