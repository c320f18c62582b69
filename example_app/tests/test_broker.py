"""The embedded broker's two races, run for real between processes: a consumer taking a message file
before its bytes are in it, and two workers creating one exchange file. A 2 ms pause in each child, where a
loaded machine deschedules it now and then, makes each race happen every time. kombu's transport is run too,
as a strict xfail: it shows these tests catch the races, and fails once kombu fixes them (celery/kombu#1551),
which is when ``example_app/broker.py`` should go."""

from __future__ import annotations

import builtins
import io
import json
import multiprocessing
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

ATOMIC = "example_app.broker:Transport"
KOMBU = pytest.param(
    "kombu.transport.filesystem:Transport",
    marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason="kombu 5.7 writes its files in place (celery/kombu#1551)"
    ),
    id="kombu",
)
MESSAGES, BINDS = 300, 50
_OPEN, _EXISTS = io.open, Path.exists
FORK = multiprocessing.get_context("fork")  # the children need this test's imports, not a fresh interpreter


def _channel(transport: str, folder: Path) -> Any:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder)}
    return Connection("filesystem://", transport=transport, transport_options=options).default_channel


class _SlowWrites:
    """A file whose writes wait first: the producer descheduled between creating a file and writing it,
    as a loaded machine does now and then, made to happen at every write."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: Any) -> int:
        time.sleep(0.002)
        return int(self._file.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _SlowWrites:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def _slow_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    opened = _OPEN(file, mode, *args, **kwargs)
    return _SlowWrites(opened) if "w" in mode else opened


def _put_all(transport: str, folder: Path) -> None:
    builtins.open = io.open = _slow_open  # this child's only: kombu's open() and pathlib's io.open
    channel = _channel(transport, folder)
    for n in range(MESSAGES):
        channel._put("orders", {"n": n, "body": "x" * 2000})


@pytest.mark.parametrize("transport", [ATOMIC, KOMBU])
def test_a_consumer_never_takes_a_message_before_it_is_written(transport: str, tmp_path: Path) -> None:
    producer = FORK.Process(target=_put_all, args=(transport, tmp_path))
    producer.start()
    channel, seen, unreadable = _channel(transport, tmp_path), [], 0
    try:
        while len(seen) + unreadable < MESSAGES and (producer.is_alive() or channel._size("orders")):
            try:
                seen.append(channel._get("orders")["n"])
            except json.JSONDecodeError:  # kombu's worker stops here ("Unrecoverable error")
                unreadable += 1
            except Empty:
                pass
    finally:
        producer.join(60)
    assert producer.exitcode == 0
    assert unreadable == 0
    assert sorted(seen) == list(range(MESSAGES))  # every message, once (a millisecond's are in uuid order)


def _slow_exists(path: Path) -> bool:
    found = _EXISTS(path)
    time.sleep(0.002)  # descheduled between looking for the file and making it
    return found


def _bind(transport: str, folder: Path, queue: str, start: Any) -> None:
    Path.exists = _slow_exists  # type: ignore[method-assign]  # this child's only
    channel = _channel(transport, folder)
    start.wait()
    channel._queue_bind("celery.pidbox", "", "", queue)


@pytest.mark.parametrize("transport", [ATOMIC, KOMBU])
def test_two_workers_binding_to_a_new_exchange_both_keep_theirs(transport: str, tmp_path: Path) -> None:
    failed = []
    for attempt in range(BINDS):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        start = FORK.Barrier(2)
        binders = [FORK.Process(target=_bind, args=(transport, folder, q, start)) for q in ("w1", "w2")]
        for binder in binders:
            binder.start()
        for binder in binders:
            binder.join(30)
        table = json.loads((folder / "celery.pidbox.exchange").read_text() or "[]")
        if [b.exitcode for b in binders] != [0, 0] or sorted(row[2] for row in table) != ["w1", "w2"]:
            failed.append(attempt)
    assert failed == []
