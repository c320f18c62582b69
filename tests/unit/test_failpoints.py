from __future__ import annotations

import threading
from pathlib import Path

import pytest

from celery_fence import _failpoints as failpoints


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(failpoints.ENV, str(tmp_path))
    failpoints._folder.cache_clear()
    yield tmp_path
    failpoints._folder.cache_clear()


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints._folder.cache_clear()
    failpoints.failpoint("before-complete")  # returns at once
    failpoints._folder.cache_clear()


def test_an_unblocked_point_passes(folder: Path) -> None:
    failpoints.failpoint("before-complete")
    assert list(folder.iterdir()) == []


def test_a_blocked_point_waits_until_released(folder: Path) -> None:
    (folder / "before-complete.block").touch()
    passed = threading.Event()
    thread = threading.Thread(target=lambda: (failpoints.failpoint("before-complete"), passed.set()))
    thread.start()
    deadline = threading.Event()
    while not list(folder.glob("before-complete.*.reached")):
        deadline.wait(0.01)
    assert not passed.is_set()
    (folder / "before-complete.block").unlink()
    thread.join(5)
    assert passed.is_set()
