"""RabbitMQ as the broker of the real-worker tests: a vhost of the test's own on the server at
127.0.0.1:5672 (made and deleted with ``rabbitmqctl``: its queues and messages go with it), and a private
node for the consumer-timeout case.

RabbitMQ before 3.12 (this machine runs 3.10) has no per-queue or per-policy ``consumer_timeout``: it is one
setting of the whole node. Changing it on the shared server would touch every channel opened meanwhile, so
that case starts a node of its own, stopped by its process group at the end.
"""

from __future__ import annotations

import contextlib
import os
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

from celery_fence.testing import free_port

from ..support.required import require_server

HOST, PORT, USER, PASSWORD = "127.0.0.1", 5672, "guest", "guest"
# The Debian wrapper in /usr/sbin switches to the rabbitmq user; the script behind it runs as the caller.
_SERVER_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")


def _refusal(port: int) -> str | None:
    """None if an AMQP login to ``127.0.0.1:port`` works, else why not."""
    import amqp

    connection = amqp.Connection(f"{HOST}:{port}", userid=USER, password=PASSWORD, connect_timeout=2)
    try:
        connection.connect()
    except (OSError, amqp.exceptions.AMQPError) as exc:
        return f"{HOST}:{port}: {exc!r}"
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return None


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    return subprocess.run([binary, "-q", *args], capture_output=True, text=True, timeout=60, check=False)


def ready_messages(app: Any, queue: str) -> int:
    """How many messages of ``queue`` wait for a consumer (not counting those delivered and unacked)."""
    with app.connection_for_write() as connection:
        return int(connection.default_channel.queue_declare(queue, passive=True).message_count)


@contextlib.contextmanager
def own_vhost() -> Iterator[str]:
    """The broker URL of a new vhost on the shared server (guest may do everything in it); the vhost is
    deleted at the end, with every queue, exchange and message the test left in it."""
    refusal = _refusal(PORT)
    require_server("RabbitMQ", refusal is None, str(refusal))
    name = f"fence-{uuid.uuid4().hex[:10]}"
    made = _rabbitmqctl("add_vhost", name)
    require_server("rabbitmqctl", made.returncode == 0, f"add_vhost {name}: {made.stderr.strip()} (root?)")
    try:
        allowed = _rabbitmqctl("set_permissions", "-p", name, USER, ".*", ".*", ".*")
        assert allowed.returncode == 0, allowed.stderr
        yield f"amqp://{USER}:{PASSWORD}@{HOST}:{PORT}/{name}"
    finally:
        _rabbitmqctl("delete_vhost", name)


class PrivateNode:
    """A RabbitMQ node of the test's own on a free port, with a ``consumer_timeout`` of ``timeout_ms`` and
    the channels' check of it every ``tick_ms`` (60 s by default, too coarse for a test)."""

    def __init__(self, directory: Path, timeout_ms: int, tick_ms: int = 200) -> None:
        self.directory, self.port, self.dist_port = directory, free_port(), free_port()
        self.timeout_ms, self.tick_ms = timeout_ms, tick_ms
        self.process: subprocess.Popen[bytes] | None = None

    def url(self) -> str:
        return f"amqp://{USER}:{PASSWORD}@{HOST}:{self.port}//"

    def start(self, timeout: float = 60.0) -> PrivateNode:
        script = next((s for s in map(shutil.which, _SERVER_SCRIPTS) if s), None)
        require_server("rabbitmq-server", script is not None, "install rabbitmq-server")
        assert script is not None
        d = self.directory
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{self.port}\nconsumer_timeout = {self.timeout_ms}\n"
        )
        (d / "advanced.config").write_text(f"[{{rabbit, [{{channel_tick_interval, {self.tick_ms}}}]}}].\n")
        (d / "enabled_plugins").write_text("[].\n")
        env = {
            **os.environ,
            "HOME": str(d),  # its own Erlang cookie
            "RABBITMQ_CONF_ENV_FILE": "/dev/null",  # not the system node's name and settings
            "RABBITMQ_NODENAME": f"fence-{uuid.uuid4().hex[:8]}@localhost",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
            "ERL_EPMD_ADDRESS": HOST,
        }
        with open(d / "server.out", "wb") as out:
            self.process = subprocess.Popen(
                [script], env=env, cwd=d, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while _refusal(self.port) is not None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (d / "server.out").read_text(errors="replace")[-3000:]
                pytest.fail(f"private RabbitMQ node on port {self.port} did not start:\n{log}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """SIGTERM the node's process group (the script and the Erlang VM), then SIGKILL what is left."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@contextlib.contextmanager
def private_node(timeout_ms: int) -> Iterator[str]:
    """The broker URL of a private node whose ``consumer_timeout`` is ``timeout_ms``; stopped at the end."""
    directory = Path(tempfile.mkdtemp(prefix="fence-rabbitmq-"))
    node = PrivateNode(directory, timeout_ms)
    try:
        yield node.start().url()
    finally:
        node.stop()
        shutil.rmtree(directory, ignore_errors=True)
