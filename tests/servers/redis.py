"""A private ``redis-server`` (no persistence unless asked) on a free port in a directory of its own; the
shared Redis on 6379 is never touched."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import redis

from celery_fence.testing import free_port

from ..support.required import require_server
from .process import ServerProcess


class RedisServer(ServerProcess):
    """One private redis-server process, started and stopped by pid (SIGKILL crashes it: what survives is
    what the server had made durable)."""

    label = "redis-server"

    def __init__(self, directory: Path, port: int | None = None, *options: str) -> None:
        super().__init__(directory / "redis.log")
        self.directory, self.port, self.options = directory, port or free_port(), options

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
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(args, cwd=self.directory)
        self.wait_until(self._answers, 10, self.port)
        return self

    def _answers(self) -> bool:
        with contextlib.suppress(redis.ConnectionError), self.client() as client:
            client.ping()
            return True
        return False

    def restart(self) -> None:
        """Stop and start on the same port: without persistence, every key is gone."""
        self.stop()
        self.start()


def drop_prefix(server: RedisServer, prefix: str) -> None:
    with server.client() as client:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if names:
            client.delete(*names)
