"""The worker side of the fence: what ``celery worker`` runs besides the tasks. Internal, except
:func:`check_settings`.

- ``bootstep``: the worker's steps (recovery, metrics) and its ``--fence-*`` options;
- ``election``: one recoverer at a time, cluster-wide;
- ``request``: the main process's ``Request``, which releases the lease of a pool process that died;
- ``startup`` (with ``spelling``, ``task_checks``, ``store_probe``): the settings check at start.
"""

from __future__ import annotations

from .startup import check_settings

__all__ = ["check_settings"]
