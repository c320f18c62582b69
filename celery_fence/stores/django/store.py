"""The ``django://<alias>`` store: the SQL store on the database of ``settings.DATABASES[alias]``, whose
run transactions are Django transactions on Django's own connection (:mod:`.run`).

The store's own operations (acquire, renew, a completion without a transaction, recovery, the
``celery fence`` commands) run on its own SQLAlchemy engines, built from the same settings, as the
``postgresql://`` or ``sqlite://`` store would: the renewer's thread never touches Django's connection.
A run's transaction (``self.fence.atomic()``, ``self.fence.transaction()``, an atomic step) runs on
Django's connection for the alias in the run's thread, so the ORM writes in it are the run's writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist
from sqlalchemy.engine import URL

from ...errors import ConfigurationError
from ...lease import Lease
from ..base import RunTransactionHandle
from ..capabilities import Capabilities
from ..sql.engine import SessionLimits
from ..sql.store import SQLStore, sql_capabilities
from ..sql.url import check_sql_store_url
from .borrowed import BorrowedConnection
from .run import DjangoCommitTransaction, DjangoRunTransaction

__all__ = [
    "DjangoStore",
    "check_django_store_url",
    "database_clock",
    "database_url",
    "django_capabilities",
    "settings_url",
]

# The libpq parameters of a PostgreSQL database's OPTIONS that the store's engines pass on as well.
_LIBPQ_OPTIONS = (
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "options", "service", "passfile",
    "target_session_attrs", "gssencmode", "krbsrvname",
)


def alias_of(url: str) -> str:
    """``django://default`` -> ``default``."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "django" or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise ConfigurationError(
            f"a Django store URL is django://<alias>, the alias of a database in settings.DATABASES, "
            f"such as 'django://default'; got {url!r}"
        )
    return parts.netloc


def database_url(alias: str) -> str:
    """The SQLAlchemy URL of ``settings.DATABASES[alias]`` (as Django has it now: a test run's database
    too). ``ConfigurationError`` without settings, for an unknown alias or a database the store cannot use."""
    try:
        settings = connections[alias].settings_dict
    except ConnectionDoesNotExist:
        known = ", ".join(sorted(connections.settings)) or "none"
        raise ConfigurationError(
            f"django://{alias}: settings.DATABASES has no {alias!r} database (it has: {known})"
        ) from None
    except ImproperlyConfigured as exc:  # no DJANGO_SETTINGS_MODULE, no settings.configure()
        raise ConfigurationError(
            f"django://{alias} reads settings.DATABASES, and Django's settings are not configured "
            f"({exc}): set DJANGO_SETTINGS_MODULE (or call django.setup()) before the Celery app reads its "
            "configuration"
        ) from exc
    return settings_url(alias, settings)


def settings_url(alias: str, settings: dict[str, Any]) -> str:
    """The SQLAlchemy URL of a Django database's ``settings`` (what ``DATABASES[alias]`` holds)."""
    engine, name = settings.get("ENGINE", ""), settings.get("NAME")
    if engine == "django.db.backends.sqlite3":
        text = str(name or "")
        if not text or text == ":memory:" or "mode=memory" in text:
            raise ConfigurationError(
                f"django://{alias} is an in-memory SQLite database, private to one connection; the store "
                f"needs a file: set DATABASES[{alias!r}]['NAME'] (and ['TEST']['NAME'] for tests) to a path"
            )
        return URL.create("sqlite", database=text).render_as_string(hide_password=False)
    if engine == "django.db.backends.postgresql":
        options = settings.get("OPTIONS") or {}
        query = {key: str(options[key]) for key in _LIBPQ_OPTIONS if key in options}
        return URL.create(
            "postgresql+psycopg",
            username=settings.get("USER") or None,
            password=settings.get("PASSWORD") or None,
            host=settings.get("HOST") or None,
            port=int(settings["PORT"]) if settings.get("PORT") else None,
            database=name or None,
            query=query,
        ).render_as_string(hide_password=False)
    raise ConfigurationError(
        f"django://{alias} is a {engine or 'database without an ENGINE'}: the fence store runs on "
        "django.db.backends.postgresql (with psycopg 3) or django.db.backends.sqlite3"
    )


# Now by the database's clock, the clock every expiry is judged by (stores.sql.queries), epoch seconds.
_NOW = {
    "postgresql": "SELECT extract(epoch from clock_timestamp())",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
}


def database_clock(alias: str) -> float:
    """Now by the clock of Django's ``alias`` database, which judges the expiry of its leases (the admin
    pages show an expiry by it, not by the web server's clock)."""
    django = connections[alias]
    with django.cursor() as cursor:
        cursor.execute(_NOW[django.vendor])
        return float(cursor.fetchone()[0])


def check_django_store_url(url: str) -> None:
    """What no store can work with, refused without a round trip: the URL's form, the alias, the
    database's engine, and what the SQL store refuses of the database's own URL."""
    check_sql_store_url(database_url(alias_of(url)))


def django_capabilities(url: str) -> Capabilities:
    """The SQL store's, with the alias whose transactions are the run's (``self.fence.atomic()``)."""
    alias = alias_of(url)
    found = sql_capabilities(database_url(alias))
    return replace(found, name=f"{found.name} (Django's {alias!r} database)", django_alias=alias)


class DjangoStore(SQLStore):
    """The SQL store on a Django database; see the module docstring and :class:`SQLStore`."""

    capabilities_for = staticmethod(django_capabilities)
    check_url = staticmethod(check_django_store_url)

    def __init__(self, url: str, limits: SessionLimits | None = None) -> None:
        self.alias = alias_of(url)
        super().__init__(database_url(self.alias), limits)
        self.url, self.database_url = url, self.connections.url
        self.capabilities = django_capabilities(url)
        self.borrowed = BorrowedConnection(self.alias)
        # The store's own PostgreSQL sessions wait this long for a lock or a statement; the run's
        # transaction on Django's connection gets the same limits, for that transaction only.
        self._timeouts = None
        if self.dialect == "postgresql":
            ms = {"lock_timeout": self.limits.lock, "statement_timeout": self.limits.statement}
            self._timeouts = "SELECT " + ", ".join(
                f"set_config('{name}', '{int(value * 1000)}', true)" for name, value in ms.items()
            )

    def begin_commit(
        self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None
    ) -> RunTransactionHandle:
        """``fence_mode="commit"``'s transaction on Django's connection: the ORM's writes join the claim."""
        self.connections.ready()
        return DjangoCommitTransaction(self.statements, self.borrowed, key, owner, ttl, self._timeouts, run)

    def _run_transaction(self, lease: Lease, ttl: float, step: str | None = None) -> DjangoRunTransaction:
        """The run's transaction on Django's connection (``begin_run``, and ``transaction()`` of one block):
        the lease row checked and locked until it commits or rolls back. ``StaleToken``: not current."""
        return DjangoRunTransaction(self.statements, self.borrowed, lease, ttl, self._timeouts, step)
