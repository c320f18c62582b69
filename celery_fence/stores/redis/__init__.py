"""The Redis store: ``store`` (every operation one Lua script of ``lua/``), ``boundary`` (its URL and its
one error boundary), ``rows`` (the shapes between the store and its scripts), ``names`` (the key names),
``connection`` (the client) and ``layout`` (one ``server`` or a ``cluster``, chosen when the store opens)."""

from .store import RedisStore

__all__ = ["RedisStore"]
