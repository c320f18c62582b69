"""The Django shop (example_app/django_shop: the order pipeline on the Django ORM) passes its own tests,
run as its developers run them: ``pytest`` in its folder, with pytest-django, its settings, and a test
database that pytest-django creates on the PostgreSQL server and drops."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from .conftest import PG_SERVER_URL

SHOP = Path(__file__).resolve().parents[1] / "django_shop"


@pytest.mark.postgres
def test_the_django_shops_own_tests_pass() -> None:
    server = make_url(PG_SERVER_URL)
    env = {
        **os.environ,
        "SHOP_DATABASE": f"celery_fence_shop_{uuid.uuid4().hex[:8]}",  # other runs may share the server
        "SHOP_DATABASE_HOST": server.host or "127.0.0.1",
        "SHOP_DATABASE_PORT": str(server.port or 5432),
        "SHOP_DATABASE_USER": server.username or "postgres",
        "SHOP_DATABASE_PASSWORD": server.password or "",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=SHOP, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if "could not connect" in run.stdout or "Connection refused" in run.stdout:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
            pytest.fail(f"PostgreSQL is not available (CI is set):\n{run.stdout[-3000:]}", pytrace=False)
        pytest.skip(f"PostgreSQL is not available at {server.host}:{server.port}")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "warning" not in run.stdout, run.stdout[-3000:]
