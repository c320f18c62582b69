"""Whether an idle connection is still usable, without a round trip.

A connection that the server ended while it sat idle (a restart, pg_terminate_backend, ``CLIENT KILL``, an
idle timeout, a proxy that closed) has the server's goodbye, or EOF, waiting on its socket; an idle
connection that is fine has nothing to read. One ``poll`` of the socket tells them apart for about a
microsecond, where a ping (``pool_pre_ping``, a ``PING``) costs a round trip on every use. A connection
must be checked before a statement is sent on it: a statement that fails in flight cannot be told apart
from one that ran and lost its reply, so it cannot simply be sent again.
"""

from __future__ import annotations

import select

__all__ = ["idle_socket_is_readable"]


def idle_socket_is_readable(fd: int) -> bool:
    """True when the idle socket ``fd`` has data or EOF waiting: the connection is to be replaced."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
