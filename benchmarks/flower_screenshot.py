"""Screenshots of what a real Flower keeps of fenced runs once they ended (``make flower-screenshot``).

Starts Flower and two Redis-broker workers with events on (``-E``) for ``benchmarks/flower_app.py``, then
makes runs that meet each fence state while they last: a normal SUCCESS, a duplicate absorbed
(``task-fence-duplicate``: FENCE-DUPLICATE, where it ends), a stale run refused (its process SIGSTOPped past
the 3 s ttl while a copy of the same id takes over, then resumed: FENCE-REFUSED until the copy's SUCCESS), a
second task id waiting for a held key (RETRY, then SUCCESS) and a lost lease (an admin ``celery fence
release`` under a run that never checks: FENCE-LOST, then its completion is refused and the fence sends it
again: SUCCESS). Once every run has ended in Flower's ``/api/tasks``, it takes PNGs of the tasks page and of
the re-sent task's page with headless Chromium, into ``docs/img/``.

Needs Redis on 127.0.0.1:6379 (DB 7, flushed; ``FLOWER_SHOT_REDIS`` for another), Flower (the ``flower``
extra) and ``/usr/bin/chromium``
(``CHROMIUM`` to change). ``FLOWER_SHOT_SRC``: a folder with a ``celery_fence/`` to run instead of the
working tree's (the processes start in it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis

from celery_fence.testing import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
REDIS = os.environ.get("FLOWER_SHOT_REDIS", "redis://127.0.0.1:6379/7")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SRC = os.environ.get("FLOWER_SHOT_SRC")
CWD = Path(SRC) if SRC else ROOT
CELERY = [sys.executable, "-m", "celery", "-A", "benchmarks.flower_app"]


def get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return json.loads(reply.read())
    except (OSError, ValueError):
        return None


class Process:
    """A child in a process group of its own, stopped by its pid."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=CWD, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of our own group
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)


def screenshot(url: str, path: Path, workdir: Path, budget_ms: int = 10000) -> None:
    profile = tempfile.mkdtemp(prefix="chromium-", dir=workdir)
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}", f"--screenshot={path}", "--window-size=1400,900",
        f"--virtual-time-budget={budget_ms}", url,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB)")


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fence-flower-"))
    os.environ["FLOWER_SHOT_DIR"] = str(workdir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(CWD), str(ROOT)])),
           "FLOWER_SHOT_DIR": str(workdir), "FLOWER_UNAUTHENTICATED_API": "true"}  # fmt: skip
    redis.Redis.from_url(REDIS).flushdb()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs: list[Process] = []
    try:
        flower_cmd = [*CELERY, "flower", f"--port={port}", "--address=127.0.0.1"]
        flower = Process(flower_cmd, env, workdir / "flower.log")
        procs.append(flower)
        wait_for(lambda: get(f"{url}/api/workers") is not None, 60, "Flower")
        for name in ("a", "b"):
            worker = Process(
                [*CELERY, "worker", "-P", "prefork", "-c", "2", "-E", "-Q", "fence.flower",
                 "-n", f"shot-{name}@%h", "-l", "INFO", "--without-gossip", "--without-mingle"],
                env, workdir / f"worker-{name}.log",
            )  # fmt: skip
            procs.append(worker)
            wait_for(lambda w=worker: "ready." in w.text(), 90, f"worker {name}")
        ids = produce(workdir, env)
        try:  # the end state: every run ended, in the state Flower keeps
            wait_for(lambda: ended(url, ids), 120, "every run to end in Flower")
        finally:
            shown = {k: (v.get("name"), v.get("state")) for k, v in (get(f"{url}/api/tasks") or {}).items()}
            print(f"Flower shows: {json.dumps(shown)} (logs in {workdir})")
        IMG.mkdir(parents=True, exist_ok=True)
        screenshot(f"{url}/tasks", IMG / "flower-tasks.png", workdir)
        screenshot(f"{url}/task/{ids['resent']}", IMG / "flower-resent-task.png", workdir)
        screenshot(f"{url}/task/{ids['refused']}", IMG / "flower-refused-task.png", workdir)
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


ENDS = {"SUCCESS", "FAILURE", "FENCE-DUPLICATE"}  # where this script's runs end, as Flower keeps them


def ended(url: str, ids: dict[str, str]) -> bool:
    tasks = get(f"{url}/api/tasks") or {}
    return all((tasks.get(task_id) or {}).get("state") in ENDS for task_id in ids.values())


def produce(workdir: Path, env: dict[str, str]) -> dict[str, str]:
    from benchmarks.flower_app import charge, export, refund

    def pid_of(task_id: str) -> int:
        found = wait_for(lambda: list(workdir.glob(f"{task_id}.*.started")), 60, f"{task_id} to start")
        return int(found[0].name.split(".")[1])

    ok = charge.apply_async((1,))  # SUCCESS
    ok.get(timeout=60)
    again = charge.apply_async((1,))  # a copy of a finished key: its stored result (SUCCESS too)
    again.get(timeout=60)
    holder = charge.apply_async((2,), {"work": 4.0})
    pid_of(holder.id)
    duplicate = charge.apply_async((2,))  # the key is held: absorbed, FENCE-DUPLICATE
    waiter = refund.apply_async((2,))  # fence_on_busy="retry": looks again until the key is done
    holder.get(timeout=60)

    stale = charge.apply_async((3,), {"work": 2.0})
    pid = pid_of(stale.id)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(4.0)  # the fault: paused past the 3 s ttl
    # The broker delivers the same task id again: the copy takes the key over and works on while the
    # stale run wakes and tries its write (FENCE-REFUSED); the copy's SUCCESS then ends the shared row.
    charge.apply_async((3,), {"work": 4.0}, task_id=stale.id)
    wait_for(lambda: len(list(workdir.glob(f"{stale.id}.*.started"))) == 2, 60, "the copy to start")
    os.kill(pid, signal.SIGCONT)

    lost = export.apply_async((5.0,))
    pid_of(lost.id)
    subprocess.run([*CELERY, "fence", "release", lost.id, "--yes"], env=env, cwd=CWD, check=True, timeout=60)
    return {
        "success": ok.id, "again": again.id, "holder": holder.id, "duplicate": duplicate.id,
        "waiter": waiter.id, "refused": stale.id, "resent": lost.id,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
