"""The worker's first round trip to its store, made at start so that a store that cannot work is named
before the worker says ``ready.`` (else it shows at the first run, as a wait and then a bare driver error).

What cannot work stops the worker (``ConfigurationError``): a SQLite file in a directory that does not
exist, credentials the store refuses, tables that are not celery-fence's or that this role may not create.
A store that does not answer is a warning: runs wait it out (``fence_store_wait``), and it may be starting,
as the worker is.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .config import FenceConfig
from .errors import ConfigurationError, StoreUnavailable
from .stores import open_store, scheme_of
from .stores.urls import mask_url
from .stores.waits import ADMIN_LOCK_WAIT, lock_wait

__all__ = ["PROBE_KEY", "check_sqlite_directory", "probe_store", "sqlite_file"]

log = logging.getLogger(__name__)

PROBE_KEY = "celery-fence:startup-probe"  # never acquired: reading it changes nothing


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names; ``None`` for another store, a ``file:`` URI, or a URL the store
    refuses itself (malformed)."""
    if scheme_of(url)[0] != "sqlite":
        return None
    from sqlalchemy.engine import make_url  # SQLAlchemy: only for a SQLite store
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(url).database
    except (ArgumentError, ValueError):  # a bad port is a ValueError
        return None
    return Path(database) if database and not database.startswith("file:") else None


def check_sqlite_directory(url: str) -> None:
    """SQLite creates a missing file but not its directory; the driver then says only "unable to open
    database file", and a run takes that for an outage and waits."""
    path = sqlite_file(url)
    if path is None or path.parent.is_dir():
        return
    raise ConfigurationError(
        f"fence_store_url {mask_url(url)!r}: the directory {path.parent.resolve()} does not exist, so "
        f"SQLite cannot create {path.name} in it; create the directory, or point fence_store_url at one "
        f"that exists (a relative path is relative to the worker's current directory, {Path.cwd()})"
    )


def probe_store(config: FenceConfig) -> list[str]:
    """Open the store, read one reserved key, close it (no client is left for the pool to inherit).

    A SQL store creates or upgrades its tables on first use, so this is also where a missing migration is
    made, or refused. Returns the warnings; raises ``ConfigurationError`` for what cannot work.
    """
    url = config.store_url
    check_sqlite_directory(url)
    store = open_store(url)
    try:
        with lock_wait(ADMIN_LOCK_WAIT):  # never wait long behind another process's SQLite transaction
            store.get(PROBE_KEY)
    except StoreUnavailable as exc:
        return [
            f"the fence store cannot be used at worker start: {exc}. Until it can, each run waits for it "
            f"up to fence_store_wait ({config.store_wait:g}s), then fails"
        ]
    finally:
        store.close()
    log.info("celery-fence: the fence store %s answered", mask_url(url))
    return []
