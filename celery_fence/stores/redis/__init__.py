"""The Redis store: ``store`` (every operation one Lua script of ``lua/``), ``boundary`` (its URL and its
one error boundary) and ``rows`` (the shapes between the store and its scripts)."""

from .store import RedisStore

__all__ = ["RedisStore"]
