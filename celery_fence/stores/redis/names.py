"""The names of a key's Redis keys, ``<prefix><kind>:{<mark><key>}``, and SCAN patterns over them.

The ``{...}`` hash tag keeps a key's data in one slot of a Redis Cluster. On a cluster the mark is ``=``
(it keeps the tag non-empty for a key that starts with ``}``); on one server it is empty."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KeyNames"]


@dataclass(frozen=True)
class KeyNames:
    prefix: str
    mark: str

    def name_of(self, kind: str, key: str) -> str:
        return f"{self.prefix}{kind}:{{{self.mark}{key}}}"

    def names_of(self, key: str, *kinds: str) -> list[str]:  # the key's own (the scripts make the others)
        return [self.name_of(kind, key) for kind in kinds]

    def pattern(self, rest: str) -> str:
        """A SCAN pattern: the prefix matched as it is, then ``rest``."""
        return "".join(f"\\{c}" if c in "*?[]\\" else c for c in self.prefix) + rest
