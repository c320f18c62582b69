"""An ORM ``Session`` on a run's transaction: what ``self.fence.session()`` yields.

The session joins the ``Connection`` of one ``transaction()`` block in SQLAlchemy's ``rollback_only`` mode:
its flushes are the block's writes, so they commit with the run's completion, and it never begins or
commits a transaction of its own (no extra round trip). Its ``commit()`` and ``rollback()`` are refused,
as the connection's are: either would end the run's transaction apart from its completion. A flush that
fails inside it rolls back what the block would have undone anyway (the block's savepoint, or the whole
transaction for the run's first block).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from ...errors import UsageError

__all__ = ["FencedSession", "session_on"]

_HAND_MADE = (
    "the session's writes commit with the run's completion: do not call session.{what}(); call "
    "session.flush() to send them now, and raise to undo this block"
)


class FencedSession(Session):
    """A ``Session`` whose writes belong to the run's transaction (see the module docstring)."""

    def commit(self) -> NoReturn:
        raise UsageError(_HAND_MADE.format(what="commit"))

    def rollback(self) -> NoReturn:
        raise UsageError(_HAND_MADE.format(what="rollback"))


@contextmanager
def session_on(conn: Connection, **options: Any) -> Iterator[FencedSession]:
    """A :class:`FencedSession` on ``conn``, flushed when the block ends without an exception."""
    session = FencedSession(bind=conn, join_transaction_mode="rollback_only", **options)
    try:
        yield session
        session.flush()
    finally:
        session.close()  # in rollback_only mode, leaves the joined transaction as it is
