"""Servers the tests start and stop themselves, by pid: PostgreSQL (one, or a primary and its standby),
Redis (one, or a cluster), etcd (one, or a cluster), a process holding a SQLite write lock, and a scripted
HTTP server. Each process server is a :class:`~tests.servers.process.ServerProcess`; the session's shared
ones are fixtures (tests/servers/fixtures.py, registered by tests/conftest.py)."""
