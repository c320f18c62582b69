"""docs/quickstart.md works as written: its ``shop.py``, run by a real ``celery -A shop worker``, answers
``charge.delay(7).get()`` with the result the page shows. Only the Redis databases (the test's own) and a
queue of the test's own are changed."""

from __future__ import annotations

import importlib.util
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fence.testing import Worker

from .world import BACKEND_DB, BROKER_DB

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"


def page_block(starting: str) -> str:
    """The page's fenced code block whose first line is ``starting``."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.MULTILINE)
    return next(block for block in blocks if block.startswith(starting))


@pytest.fixture
def shop(redis_server_url: str, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """``shop.py`` from the page, in ``tmp_path`` (its SQLite store lands there), imported here."""
    base = redis_server_url.rsplit("/", 1)[0]
    source = page_block("# shop.py")
    source = source.replace("redis://localhost:6379/0", f"{base}/{BROKER_DB}")
    source = source.replace("redis://localhost:6379/1", f"{base}/{BACKEND_DB}")
    queue = f"quickstart-{uuid.uuid4().hex[:8]}"
    (tmp_path / "shop.py").write_text(f"{source}\napp.conf.task_default_queue = {queue!r}\n")
    # Named shop, as the worker imports it (its tasks are shop.*), but kept out of sys.modules.
    spec = importlib.util.spec_from_file_location("shop", tmp_path / "shop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module, queue
    module.app.close()


def test_the_quickstart_runs_as_written(shop: tuple[Any, str], tmp_path: Path) -> None:
    module, queue = shop
    worker = Worker("shop", "quickstart", tmp_path, queues=queue, cwd=tmp_path).start()
    try:
        shown = page_block(">>> from shop import charge").splitlines()
        call, expected = shown[1], shown[2]
        assert call.startswith(">>> charge.delay(7).get(timeout=10)")
        assert repr(module.charge.delay(7).get(timeout=30)) == expected
    finally:
        worker.stop()
    assert (tmp_path / "shop-fence.db").exists()  # the store the page names, in the worker's directory
