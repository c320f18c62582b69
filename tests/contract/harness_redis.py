"""The Redis harness: a private ``redis-server`` (no persistence) on a free port in a temp dir.

The server starts on first use and is stopped by pid at the end of the session (and at exit). Each test
opens its store under a prefix of its own, carried in the URL (``?prefix=``) so other processes reach
the same data, and its keys are deleted afterwards. The shared Redis on 6379 is never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_fence import open_store
from celery_fence.testing import free_port

from ..conftest import require_server
from .harness import Harness, end_process

# Move the store-clock deadline of every live lease of a prefix ARGV[2] ms into the past (10,000 s: it
# expires now), in the lease hash and in the index of leased keys alike.
_EXPIRE = """
for _, name in ipairs(redis.call('KEYS', ARGV[1] .. 'lease:*')) do
  if redis.call('HEXISTS', name, 'exp') == 1 then redis.call('HINCRBY', name, 'exp', -tonumber(ARGV[2])) end
end
for _, key in ipairs(redis.call('ZRANGE', ARGV[1] .. 'live', 0, -1)) do
  redis.call('ZINCRBY', ARGV[1] .. 'live', -tonumber(ARGV[2]), key)
end
"""


class RedisServer:
    """One private redis-server process, started and stopped by pid."""

    def __init__(self, directory: Path, port: int | None = None, *options: str) -> None:
        self.directory, self.port, self.options = directory, port or free_port(), options
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0, prefix: str | None = None) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}" + (f"?prefix={prefix}" if prefix else "")

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(port=self.port, db=db, decode_responses=True, socket_timeout=5)

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        require_server("redis-server", binary is not None, "install redis-server (apt install redis-server)")
        assert binary is not None
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        args += ["no", "--dir", str(self.directory), "--daemonize", "no", "--logfile", "redis.log"]
        args += self.options  # later directives win: e.g. ("--appendonly", "yes") for a durable server
        self.process = subprocess.Popen(args, cwd=self.directory)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError), self.client() as client:
                client.ping()
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"redis-server on port {self.port} did not start:\n{log}")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        end_process(process)

    def crash(self) -> None:
        """SIGKILL: what survives is what the server had made durable."""
        process, self.process = self.process, None
        end_process(process, signal.SIGKILL)

    def restart(self) -> None:
        """Stop and start on the same port: without persistence, every key is gone."""
        self.stop()
        self.start()


_shared: list[RedisServer] = []


def shared_server(request: pytest.FixtureRequest) -> RedisServer:
    """The session's private server, started on first use."""
    if not _shared:
        directory = Path(tempfile.mkdtemp(prefix="fence-redis-"))
        server = RedisServer(directory).start()
        _shared.append(server)

        def stop() -> None:
            server.stop()
            shutil.rmtree(directory, ignore_errors=True)
            _shared.clear()

        request.session.addfinalizer(stop)
        atexit.register(stop)
    return _shared[0]


def drop_prefix(server: RedisServer, prefix: str) -> None:
    with server.client() as client:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if names:
            client.delete(*names)


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    server = shared_server(request)
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    store = open_store(server.url(prefix=prefix))
    yield store
    store.close()
    drop_prefix(server, prefix)


def _expire(store: Any) -> None:
    shift(store, 10_000)


def shift(store: Any, seconds: float) -> None:
    """Every live lease's deadline moves ``seconds`` into the past: that much store time passed for it."""
    with redis.Redis.from_url(store.url.partition("?")[0]) as client:
        client.eval(_EXPIRE, 0, store.prefix, int(seconds * 1000))


HARNESS = Harness("redis", _open, _expire, expired_lease_survives=True, multiprocess=True)
