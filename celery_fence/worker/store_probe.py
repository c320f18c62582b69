"""The worker's first round trip to its store, made at start so that a store that cannot work is named
before the worker says ``ready.`` (else it shows at the first run, as a wait and then a bare driver error).

What cannot work stops the worker (``ConfigurationError``): a SQLite file in a directory that does not
exist, a database or role the server does not have, credentials the store refuses, tables that are not
celery-fence's or that this role may not create.
A store that does not answer is a warning: runs wait it out (``fence_store_wait``), and it may be starting,
as the worker is.
"""

from __future__ import annotations

import logging

from ..config import FenceConfig
from ..errors import StoreUnavailable
from ..stores import open_store
from ..stores.urls import mask_url
from ..stores.waits import ADMIN_LOCK_WAIT, lock_wait

__all__ = ["PROBE_KEY", "probe_store"]

log = logging.getLogger(__name__)

PROBE_KEY = "celery-fence:startup-probe"  # never acquired: reading it changes nothing


def probe_store(config: FenceConfig) -> list[str]:
    """Open the store, read one reserved key, close it (no client is left for the pool to inherit).

    A SQL store creates or upgrades its tables on first use, so this is also where a missing migration is
    made, or refused. Returns the warnings; raises ``ConfigurationError`` for what cannot work.
    """
    url = config.store_url
    store = open_store(url)  # refuses first, without a round trip, what the store's check_url refuses
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
