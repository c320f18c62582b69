"""The SQL store's connection layer: everything between the store and its database.

It owns both engines (one for explicit transactions, one in autocommit where a statement is a round trip),
the connection held for the hot statements (``driver``), the schema check on first use, and what a forked
child must drop; every error leaves it through the store's one boundary (``errors``). The store above it
only says which statement to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection

from ..._process import forget_in_child
from .driver import DriverStatements
from .engine import SessionLimits, create_store_engine
from .errors import translate_errors
from .queries import Queries, queries_for
from .schema import migrate, schema_current

__all__ = ["Connections"]


class Connections:
    def __init__(self, url: str, limits: SessionLimits) -> None:
        self.url = url
        self.engine = create_store_engine(url, limits)  # explicit transactions
        self.autocommit_engine = create_store_engine(url, limits, autocommit=True)
        self.dialect = self.engine.dialect.name
        self.queries: Queries = queries_for(self.dialect)
        self._hot = DriverStatements(url, self.autocommit_engine, self.queries)
        self._schema_ready = False
        forget_in_child(self)

    def migrate(self) -> None:
        with translate_errors(self.url), self.engine.begin() as conn:
            migrate(conn)
        self._schema_ready = True

    def ready(self) -> None:
        """Create or upgrade the schema on first use."""
        if self._schema_ready:
            return
        # Checked on the autocommit engine: a process whose runs open no fenced transaction then holds
        # one connection, not one per engine.
        with translate_errors(self.url), self.autocommit_engine.connect() as conn:
            current = schema_current(conn)
        if not current:
            self.migrate()
        self._schema_ready = True

    @contextmanager
    def one(self) -> Iterator[Connection]:
        """An autocommit connection: each statement is its own transaction and one round trip."""
        self.ready()
        with translate_errors(self.url), self.autocommit_engine.connect() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One short explicit transaction, committed at the end of the block."""
        self.ready()
        with translate_errors(self.url), self.engine.begin() as conn:
            yield conn

    def hot(self, name: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of hot statement ``name``: one autocommit round trip on the driver's cursor."""
        self.ready()
        return self._hot.rows(name, params)  # its errors are translated where they are raised

    def close(self) -> None:
        self._hot.close()
        self.engine.dispose()
        self.autocommit_engine.dispose()

    def forget_after_fork(self) -> None:
        """In a forked child: new, empty pools, the parent's connections dropped without being closed
        (closing would end the parent's sessions); SQLAlchemy's recipe for ``fork``."""
        self._hot.forget_after_fork()
        self.engine.dispose(close=False)
        self.autocommit_engine.dispose(close=False)
