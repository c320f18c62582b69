"""The embedded broker: kombu's filesystem transport with its two file writes made atomic.

kombu 5.7 writes a message in place (create, lock, write), and a consumer takes any ``*.msg`` file by
renaming it without the lock: it can take the file before its bytes are in it. It then reads ``""``, the
message is lost and the worker stops with ``Unrecoverable error: JSONDecodeError`` (celery/kombu#1551; one
process putting 3,000 messages while another took them lost 209 this way here, in one run). Two workers
starting at once race the same way on a new exchange file: one creates it empty, the other reads it before it
is written.

Here each file is written under a name no reader looks for, then put in place by one rename (a link for a
new exchange file, which fails if another process made it first; then kombu's own locked update adds the
binding to it). Readers are kombu's, unchanged.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

__all__ = ["Channel", "Transport"]


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's name: the millisecond prefix keeps the queue in order when the folder is sorted
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        _place(Path(self.data_folder_out) / name, dumps(payload), os.replace)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        file = self._exchange_file(exchange)
        if not file.exists():
            self.control_folder.mkdir(parents=True, exist_ok=True)
            table = [filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")]
            try:
                _place(file, dumps(table), os.link)
                return
            except FileExistsError:
                pass  # another process made it first: add this binding to it, under kombu's lock
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel


def _place(path: Path, text: str, put: Callable[[Path, Path], object]) -> None:
    """Write ``text`` to a hidden file beside ``path``, then ``put(hidden, path)``: readers see the whole
    file or none. The hidden name starts with a dot: no queue's ``<stamp>.<queue>.msg`` pattern matches it."""
    hidden = path.with_name(f".{uuid.uuid4().hex}.tmp")
    try:
        hidden.write_text(text, encoding="utf-8")
        put(hidden, path)
    except FileExistsError:
        raise
    except OSError as exc:
        raise ChannelError(f"Cannot add file {str(path)!r} to directory") from exc
    finally:
        hidden.unlink(missing_ok=True)
