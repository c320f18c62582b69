"""PostgreSQL: a run transaction's first statement sent with its ``BEGIN``, and its last with its ``COMMIT``,
each in one round trip, as a server-side prepared statement (docs/performance.md, "The fenced commit").

The query goes straight to psycopg's libpq connection (``pgconn``): one simple-protocol query of two or three
statements, its parameters quoted by libpq (``PQescapeLiteral``), its rows read by psycopg's own
``Transformer``. psycopg's cursor would do the same work in Python (parameter adaptation, result selection,
prepared-statement bookkeeping) at about twice the client CPU, and it would send a ``BEGIN`` of its own, in a
round trip of its own, before the first statement of a connection out of autocommit. Sent this way, psycopg
sees the transaction that our ``BEGIN`` opened (it reads the server's transaction status from libpq) and
sends no ``BEGIN`` before the run's other statements, which go through SQLAlchemy as usual.

Each statement is prepared on a connection by the query that first sends it, in the same round trip
(``PREPARE …; EXECUTE …``): a simple query is parsed and planned each time, and for these statements that was
most of the server's CPU per run. A ``PREPARE`` outlives a failed transaction, so after a failure that may
have come after it the next one prepares under a new name. psycopg prepares no statement of its own on these
connections (``driver._no_driver_prepared``): after a ``ROLLBACK`` (a savepoint's too) it would send
``DEALLOCATE ALL``, taking ours with its own. A statement found missing all the same (the caller's own
``DEALLOCATE ALL``) fails that run's transaction, and the next one prepares again.

Imported only for a PostgreSQL store: psycopg is the ``postgres`` extra.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from psycopg import errors, generators, pq, sql
from psycopg.adapt import Transformer
from sqlalchemy import Connection, TextClause
from sqlalchemy.engine.interfaces import Dialect

from .driver import compiled
from .errors import driver_error, not_sent, read_only
from .queries import Queries

__all__ = ["OneTrip", "OneTrips", "in_one_round_trip"]


@dataclass(frozen=True)
class OneTrip:
    """A statement a run's transaction sends with its ``BEGIN`` or its ``COMMIT``: its text for the driver
    (``%(name)s`` parameters), and the same prepared on the server (``$n``, in ``names`` order)."""

    text: str
    prepared_text: str
    names: tuple[str, ...]
    tag: str  # its prepared statement's name on a connection, but for a generation suffix

    @classmethod
    def of(cls, name: str, clause: TextClause, dialect: Dialect) -> OneTrip:
        text, _order = compiled(clause, dialect)
        names: list[str] = []

        def number(found: re.Match[str]) -> str:
            if found.group(1) not in names:
                names.append(found.group(1))
            return f"${names.index(found.group(1)) + 1}"

        prepared = re.sub(r"%\((\w+)\)s", number, text)
        return cls(text, prepared, tuple(names), f"fence_{name}_{zlib.crc32(text.encode()):08x}")


class OneTrips:
    """A store's statements that its run transactions send with their ``BEGIN`` or their ``COMMIT``."""

    def __init__(self, url: str, queries: Queries, dialect: Dialect, names: Sequence[str]) -> None:
        self.url = url
        self.statements = {name: OneTrip.of(name, getattr(queries, name), dialect) for name in names}

    def send(
        self, conn: Connection, name: str, params: Mapping[str, Any], begin: bool = False,
        commit: bool = False,
    ) -> list[Any]:
        return in_one_round_trip(self.url, conn, self.statements[name], params, begin, commit)


def in_one_round_trip(
    url: str, conn: Connection, statement: OneTrip, params: Mapping[str, Any],
    begin: bool = False, commit: bool = False,
) -> list[Any]:
    """The rows of ``statement`` on ``conn``, sent in one round trip with the ``BEGIN`` before it
    (``begin``: the transaction's first statement) or the ``COMMIT`` behind it (``commit``). A statement
    that fails makes the server skip the ``COMMIT``: the caller then rolls back by closing ``conn``."""
    dbapi: Any = conn.connection.driver_connection
    info = conn.connection.info
    execute, preparing = _query(statement, info)
    try:
        wire = _wire(dbapi, info)
        query = execute + wire.arguments(statement.names, params)
        if begin:
            query = b"BEGIN; " + query
        elif commit:
            query += b"; COMMIT"
        results = wire.send(query)
        rows = wire.rows(results[begin + (preparing is not None)])  # past BEGIN's and PREPARE's results
        if preparing is not None:
            info[_PREPARED][statement.tag] = preparing  # its EXECUTE, sent as is from now on
    except Exception as exc:  # anything the driver raised
        if preparing is not None:  # its PREPARE may have run before the failure: the next takes a new name
            info[_GENERATION] = info.get(_GENERATION, 0) + 1
        if getattr(exc, "sqlstate", None) == _NO_SUCH_PREPARED_STATEMENT:
            info.pop(_PREPARED, None)
        dialect = conn.dialect
        if not isinstance(exc, dialect.loaded_dbapi.Error):
            raise not_sent(url, exc) from exc
        lost = dialect.is_disconnect(exc, dbapi, None) or read_only(exc)
        if lost:
            conn.invalidate(exc)
        raise driver_error(url, exc, lost) from exc
    return rows


def _query(statement: OneTrip, info: dict[Any, Any]) -> tuple[bytes, bytes | None]:
    """The start of the query that runs ``statement`` on this connection, up to its arguments; and, when it
    prepares the statement too, the ``EXECUTE`` to keep for the next runs (``None``: prepared already)."""
    execute: bytes | None = info.setdefault(_PREPARED, {}).get(statement.tag)
    if execute is not None:
        return execute, None
    name = f"{statement.tag}_{info.get(_GENERATION, 0)}"
    execute = f"EXECUTE {name}".encode()
    return f"PREPARE {name} AS {statement.prepared_text}; ".encode() + execute, execute


class _Wire:
    """One psycopg connection's libpq side: how a value is quoted for it, how its results are read."""

    def __init__(self, dbapi: Any) -> None:
        self.dbapi, self.pgconn = dbapi, dbapi.pgconn
        self.escaping = pq.Escaping(self.pgconn)
        self.transformer = Transformer(dbapi)  # the connection's loaders: a row reads as a cursor's would

    def arguments(self, names: Sequence[str], params: Mapping[str, Any]) -> bytes:
        """``(value, …)``, each value a literal (the prepared statement's parameter types convert it)."""
        if not names:
            return b""
        encoding = self.dbapi.info.encoding
        return b"(" + b", ".join([self._literal(params[name], encoding) for name in names]) + b")"

    def _literal(self, value: Any, encoding: str) -> bytes:
        kind = type(value)
        if kind is str and "\x00" not in value:  # psycopg refuses a NUL: let it say so, below
            return self.escaping.escape_literal(value.encode(encoding))
        if kind is int:
            return str(value).encode()
        if value is None:
            return b"NULL"
        return sql.Literal(value).as_bytes(self.dbapi)  # anything else, as psycopg adapts it

    def send(self, query: bytes) -> list[Any]:
        """The results of ``query``, one per statement; the first error the server sent is raised."""
        dbapi = self.dbapi
        with dbapi.lock:  # as psycopg's cursor: one query at a time on a connection
            if dbapi.closed:
                raise errors.OperationalError("the connection is closed")
            self.pgconn.send_query(query)
            results: list[Any] = dbapi.wait(generators.execute(self.pgconn))
        for result in results:
            if result.status not in _OK:
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    raise errors.error_from_result(result, encoding=dbapi.info.encoding)
                raise errors.InternalError(f"unexpected result status {pq.ExecStatus(result.status).name}")
        return results

    def rows(self, result: Any) -> list[Any]:
        """Its rows, each read by name (as a SQLAlchemy ``Row``)."""
        transformer = self.transformer
        transformer.set_pgresult(result)
        names = [result.fname(i).decode() for i in range(result.nfields)]
        return [
            SimpleNamespace(**dict(zip(names, row, strict=True)))
            for row in transformer.load_rows(0, result.ntuples, tuple)
        ]


def _wire(dbapi: Any, info: dict[Any, Any]) -> _Wire:
    """``dbapi``'s wire, made on its first use and kept in its pool record's ``info``."""
    wire: _Wire | None = info.get(_WIRE)
    if wire is None:  # the pool clears ``info`` when it replaces the driver connection
        wire = info[_WIRE] = _Wire(dbapi)
    return wire


_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)

# Keys of a pool entry's ``info``, which lives as long as its driver connection: its wire, the statements
# prepared on it (tag: the start of its EXECUTE), and the generation of the names the next PREPAREs take.
_WIRE = "celery_fence.wire"
_PREPARED = "celery_fence.prepared"
_GENERATION = "celery_fence.prepared_generation"
_NO_SUCH_PREPARED_STATEMENT = "26000"  # invalid_sql_statement_name
