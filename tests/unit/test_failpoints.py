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


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_failpoints_are_off_when_their_folder_is_unset_or_empty(
    value: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset (or empty), no folder is read: a block file where an "on" failpoint would look (here, the
    working directory) neither blocks the point nor gets a ``reached`` file."""
    if value is None:
        monkeypatch.delenv(failpoints.ENV, raising=False)
    else:
        monkeypatch.setenv(failpoints.ENV, value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "before-complete.block").touch()
    failpoints._folder.cache_clear()
    try:
        assert failpoints._folder() is None
        point = threading.Thread(target=failpoints.failpoint, args=("before-complete",), daemon=True)
        point.start()
        point.join(timeout=5)
        assert not point.is_alive(), "the failpoint blocked with failpoints off"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["before-complete.block"]  # nothing reached
    finally:
        (tmp_path / "before-complete.block").unlink()
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
