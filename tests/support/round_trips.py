"""Round trips to PostgreSQL counted on the wire: libpq's protocol trace of every connection an engine
opens, where one round trip is a run of client messages answered by the server (F then B lines). This
counts what a driver-level counter cannot see: the ``BEGIN`` psycopg sends on its own, and two statements
sent in one query."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+\t([FB])\t")


class RoundTrips:
    """Traces every connection ``engines`` open from now on (their pools are emptied first)."""

    def __init__(self, *engines: Engine) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="fence-trace-"))
        self._files: list[Any] = []
        self._traced: list[Any] = []  # the driver connections, to flush their trace (libpq buffers it)
        for engine in engines:
            event.listen(engine, "connect", self._trace)
            engine.dispose()

    def _trace(self, dbapi_conn: Any, _record: Any) -> None:
        file = open(self._dir / f"{len(self._files)}.trace", "w")  # noqa: SIM115  # closed in close()
        self._files.append(file)
        self._traced.append((dbapi_conn, file))
        dbapi_conn.pgconn.trace(file.fileno())

    def _flush(self) -> None:
        """libpq writes its trace through a buffer of its own: ending the trace flushes it; it goes on."""
        for dbapi_conn, file in self._traced:
            if not dbapi_conn.closed:
                dbapi_conn.pgconn.untrace()
                dbapi_conn.pgconn.trace(file.fileno())

    def total(self) -> int:
        self._flush()
        turns = 0
        for file in self._files:
            file.flush()
            last = None
            for line in Path(file.name).read_text(errors="replace").splitlines():
                found = _LINE.match(line)
                if found is None:  # a statement's text over several lines
                    continue
                if found.group(1) == "F" and last != "F":
                    turns += 1
                last = found.group(1)
        return turns

    def count(self, fn: Any, *args: Any) -> int:
        """The round trips ``fn(*args)`` makes."""
        before = self.total()
        fn(*args)
        return self.total() - before

    def close(self) -> None:
        for file in self._files:
            file.close()
        for path in self._dir.glob("*"):
            path.unlink()
        self._dir.rmdir()
