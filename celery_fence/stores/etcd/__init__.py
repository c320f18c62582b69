"""The etcd store: ``store`` (the operations), ``records`` (reading the per-key records), ``admin``
(force_release, advance), ``leases`` (the process's etcd leases), ``gateway`` (the v3 JSON gateway client
and its error mapping) and ``http`` (keep-alive connections)."""

from .store import EtcdStore

__all__ = ["EtcdStore"]
