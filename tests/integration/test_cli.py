"""``celery -A app fence ...`` through the real ``celery`` executable, on a SQLite store in a temp dir."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import StaleToken, open_store
from celery_fence.lease import Lease
from celery_fence.testing.contract.checks import dump
from tests.support.required import require_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
DONE, LIVE = "invoice:done", "invoice:live"
TTL = 30.0

APP = """\
from celery import Celery

app = Celery("cliapp", broker="memory://")
app.conf.fence_store_url = {url!r}
"""


@dataclass
class Cli:
    workdir: Path
    url: str

    def __call__(
        self, *args: str, app: str = "cliapp", stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(self.workdir)])}
        command = [str(CELERY), "-A", app, "fence", *args]
        return subprocess.run(
            command,
            check=False,
            cwd=self.workdir,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def store(self) -> Any:
        return open_store(self.url)


@dataclass
class Scenario:
    done: Lease  # acquired, stepped, completed
    old: Lease  # stepped, then expired and taken over; its complete was refused
    new: Lease  # the live holder of LIVE


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    installed = any(ep.name == "fence" for ep in entry_points(group="celery.commands"))
    require_server("the 'celery fence' entry point", installed and CELERY.exists(), "run 'pip install -e .'")
    url = f"sqlite:///{tmp_path / 'fence.db'}"
    (tmp_path / "cliapp.py").write_text(APP.format(url=url))
    return Cli(tmp_path, url)


@pytest.fixture
def scenario(cli: Cli) -> Iterator[Scenario]:
    store = cli.store()
    try:
        done = store.acquire(DONE, "host:1:done", TTL)
        store.save_step(done, "total", 42)
        store.complete(done, {"charged": 42})
        old = store.acquire(LIVE, "host:1:old", TTL)
        store.save_step(old, "total", 7)
        with store.engine.begin() as conn:  # the old holder paused past its lease
            conn.execute(
                text("UPDATE fence_leases SET expires_at = expires_at - 10000 WHERE key = :k"), {"k": LIVE}
            )
        new = store.acquire(LIVE, "host:2:new", TTL)
        with pytest.raises(StaleToken):
            store.complete(old, "stale")
        yield Scenario(done, old, new)
    finally:
        store.close()


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stdout.splitlines()


def test_migrate_creates_the_schema_and_is_idempotent(cli: Cli) -> None:
    for _ in range(2):
        result = cli("migrate")
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"fence schema is up to date on {cli.url}\n"
    assert (cli.workdir / "fence.db").exists()


def test_reading_a_store_that_does_not_exist_creates_nothing(cli: Cli) -> None:
    result = cli("leases")
    assert result.returncode == 2
    assert "no fence store at" in result.stderr and "fence migrate" in result.stderr
    assert not (cli.workdir / "fence.db").exists()


def test_without_an_app_a_missing_store_suggests_naming_one(cli: Cli) -> None:
    """Without -A, Celery's default app reads the default store URL, which is rarely
    the app's; the error says so."""
    env = {k: v for k, v in os.environ.items() if k not in ("APP", "CELERY_APP")}
    env["PYTHONPATH"] = str(ROOT)
    command = [str(CELERY), "fence", "leases"]
    result = subprocess.run(
        command, check=False, cwd=cli.workdir, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"no fence store at {cli.workdir / 'celery_fence.db'}" in result.stderr
    assert "no app was named: run it as 'celery -A yourapp fence ...'" in result.stderr
    assert "no app was named" not in cli("leases").stderr  # with -A the store is the app's own


def test_leases_lists_live_keys_and_all_adds_finished_ones(cli: Cli, scenario: Scenario) -> None:
    live = cli("leases")
    assert live.returncode == 0, live.stderr
    assert lines(live)[0].split() == ["KEY", "TOKEN", "OWNER", "STATE", "EXPIRES_IN", "RECOVERY"]
    assert [row.split()[:4] for row in lines(live)[1:]] == [
        [LIVE, str(scenario.new.token), "host:2:new", "live"]
    ]
    every = cli("leases", "--all")
    assert every.returncode == 0, every.stderr
    rows = {row.split()[0]: row.split() for row in lines(every)[1:]}
    assert rows[DONE][1:5] == [str(scenario.done.token), "host:1:done", "done", "-"]
    assert rows[LIVE][3] == "live"


def test_show_prints_state_steps_and_history_in_order(cli: Cli, scenario: Scenario) -> None:
    result = cli("show", LIVE)
    assert result.returncode == 0, result.stderr
    out = lines(result)
    assert out[0] == f"key      {LIVE}"
    assert out[1] == f"state    live, token {scenario.new.token}, owner host:2:new"
    assert "  total  7" in out
    history = out[out.index("history  4 events") + 2 :]
    rows = [row.split() for row in history]
    assert all(ISO_MS.match(row[0]) for row in rows)
    old, new = str(scenario.old.token), str(scenario.new.token)
    assert [row[1:] for row in rows] == [
        ["acquire", old, "host:1:old"],
        ["step", old, "host:1:old", "total"],
        ["takeover", new, "host:2:new"],
        ["refused", old, "host:1:old", "complete"],
    ]
    done = lines(cli("show", DONE))
    assert 'result   {"charged": 42}' in done


def test_a_run_that_gave_up_before_it_acquired_shows_as_a_dead_key(cli: Cli, scenario: Scenario) -> None:
    """``strand``'s record (a run that waited out the store and gave up): listed by default, shown with
    its reason and a ``gave-up`` event (token 0: the key never had one), and no violation."""
    store = cli.store()
    reason = "cliapp.charge[t-9] gave up waiting out the unavailable store"
    try:
        assert store.strand("invoice:9", {"task": "cliapp.charge", "id": "t-9", "args": [9]}, reason)
    finally:
        store.close()
    rows = {row.split()[0]: row.split() for row in lines(cli("leases"))[1:]}
    assert rows["invoice:9"][1:] == ["0", "-", "dead", "-", "-"]
    out = lines(cli("show", "invoice:9"))
    assert out[1:4] == ["state    dead, token 0, owner -", "expires  -", f"dead     {reason}"]
    assert out[-1].split(maxsplit=4)[1:] == ["gave-up", "0", "-", reason]
    assert cli("verify").returncode == 0


def test_show_of_an_unknown_key_is_an_error(cli: Cli, scenario: Scenario) -> None:
    result = cli("show", "invoice:nope")
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: the store knows no key 'invoice:nope'"


def test_release_fences_out_the_holder(cli: Cli, scenario: Scenario) -> None:
    declined = cli("release", LIVE, stdin="n\n")
    assert declined.returncode == 1
    assert cli.store().get(LIVE).token == scenario.new.token
    result = cli("release", LIVE, "--yes")
    assert result.returncode == 0, result.stderr
    token = int(re.search(r"token is now (\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert token > scenario.new.token
    store = cli.store()
    try:
        with pytest.raises(StaleToken):
            store.complete(scenario.new, "too late")
        assert [e.event for e in store.history(LIVE)][-2:] == ["admin-release", "refused"]
    finally:
        store.close()


def test_release_of_a_finished_key_says_that_nothing_is_fenced_out(cli: Cli, scenario: Scenario) -> None:
    """A finished key has no holder whose writes could be refused; it stays finished."""
    asked = cli("release", DONE, stdin="n\n")
    assert asked.returncode == 1
    assert "writes will be refused" not in asked.stdout
    assert "The key is done: nobody holds it, so no run is fenced out" in asked.stdout
    result = cli("release", DONE, "--yes")
    assert result.returncode == 0, result.stderr
    assert lines(result) == [
        f"released {DONE!r}: token is now {scenario.new.token + 1} (was {scenario.done.token}); the key is "
        "done: nobody holds it, so no run is fenced out, and a new delivery still returns its stored result"
    ]
    store = cli.store()
    try:
        state = store.get(DONE)
        assert state.done and state.result == {"charged": 42}  # what the message says: still finished
    finally:
        store.close()


def test_verify_passes_a_clean_store_and_names_an_injected_violation(cli: Cli, scenario: Scenario) -> None:
    clean = cli("verify")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout == "no violations in 7 events over 2 keys\n"
    store = cli.store()
    try:
        with store.engine.begin() as conn:  # the old holder's complete, as if the store had accepted it
            conn.execute(
                text(
                    "INSERT INTO fence_history (key, at, event, token, owner, detail) "
                    "VALUES (:key, 1900000000.0, 'complete', :token, :owner, NULL)"
                ),
                {"key": LIVE, "token": scenario.old.token, "owner": scenario.old.owner},
            )
    finally:
        store.close()
    dirty = cli("verify")
    assert dirty.returncode == 1
    assert lines(dirty) == [
        f"{LIVE}  stale-write: complete accepted with token {scenario.old.token} after takeover issued "
        f"token {scenario.new.token}  [2030-03-17T17:46:40.000Z]",
        "1 violation in 8 events over 2 keys",
    ]
    assert cli("verify", "--key", DONE).stdout == "no violations in 3 events over 1 key\n"


def test_prune_drops_finished_keys_only(cli: Cli, scenario: Scenario) -> None:
    assert cli("prune", "--older-than", "1d").stdout == "pruned 0 finished keys older than 86400.0s\n"
    result = cli("prune", "--older-than", "0s", "--force")  # below fence_prune_min_age: forced
    assert result.returncode == 0, result.stderr
    assert result.stdout == "pruned 1 finished key older than 0.0s\n"
    assert result.stderr.startswith("forced below fence_prune_min_age (3600.0s)")
    store = cli.store()
    try:
        assert store.get(DONE) is None
        assert [e.event for e in store.history(DONE)] == ["pruned"]
        assert store.get(LIVE) is not None
    finally:
        store.close()
    bad = cli("prune", "--older-than", "soon")
    assert bad.returncode == 2
    assert "is not a duration" in bad.stderr


def test_prune_below_the_redelivery_window_is_refused_unless_forced(cli: Cli, scenario: Scenario) -> None:
    """The broker may still redeliver a finished run's message; pruning its key first
    would run it again. The floor is fence_prune_min_age, by default the broker's visibility_timeout."""
    before = cli.store()
    try:
        kept = dump(before)
    finally:
        before.close()
    refused = cli("prune", "--older-than", "59m")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "Error: refusing to prune keys finished less than fence_prune_min_age (3600s) ago: the broker may "
        "still redeliver their messages, and a redelivered message of a pruned key runs the task again. "
        "Use --older-than 3600s or more, or --force\n"
    )
    (cli.workdir / "vtapp.py").write_text(
        APP.format(url=cli.url) + 'app.conf.broker_transport_options = {"visibility_timeout": 60}\n'
    )
    assert cli("prune", "--older-than", "59s", app="vtapp").returncode == 2
    after = cli.store()
    try:
        assert dump(after) == kept  # nothing was pruned
    finally:
        after.close()
    allowed = cli("prune", "--older-than", "1m", app="vtapp")  # the broker's own window: 60 s
    assert (allowed.returncode, allowed.stdout, allowed.stderr) == (
        0,
        "pruned 0 finished keys older than 60.0s\n",
        "",
    )


def test_advance_moves_the_next_token_past_the_floor(cli: Cli, scenario: Scenario) -> None:
    result = cli("advance", "--gap", "1000")
    assert result.returncode == 0, result.stderr
    floor = int(re.search(r"is above (\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert floor >= scenario.new.token + 1000
    assert "failover" in result.stdout
    store = cli.store()
    try:
        assert store.acquire("invoice:next", "host:3:next", TTL).token > floor
    finally:
        store.close()


def test_a_bad_store_url_is_a_one_line_error(cli: Cli) -> None:
    (cli.workdir / "badapp.py").write_text(APP.format(url="nope://x"))
    result = cli("leases", app="badapp")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("Error: unknown fence store scheme 'nope'")


INCLUDING_APP = """\
from celery import Celery

app = Celery("incapp", broker="memory://", include=["inctasks"])
app.conf.fence_store_url = {url!r}
"""
INCLUDED_TASKS = """\
from celery import shared_task

from celery_fence import FencedTask


@shared_task(base=FencedTask, bind=True, name="inctasks.work")
def work(self, n):
    return n
"""


def _abandon(cli: Cli, key: str, task: str) -> None:
    store = cli.store()
    try:
        store.acquire(key, "host:9:gone", TTL, {"task": task, "id": key, "args": [1], "kwargs": {}})
        with store.engine.begin() as conn:  # the worker died long ago
            expire = text("UPDATE fence_leases SET expires_at = expires_at - 10000 WHERE key = :k")
            conn.execute(expire, {"k": key})
    finally:
        store.close()


def test_recover_loads_the_apps_included_modules_and_sends_unknown_tasks_by_name(cli: Cli) -> None:
    """A task listed through ``include`` is this app's own; a task of another service is
    sent by name all the same. Neither is marked dead."""
    (cli.workdir / "incapp.py").write_text(INCLUDING_APP.format(url=cli.url))
    (cli.workdir / "inctasks.py").write_text(INCLUDED_TASKS)
    _abandon(cli, "own", "inctasks.work")
    _abandon(cli, "foreign", "billing.elsewhere")
    result = cli("recover", "--grace", "0", app="incapp")
    assert result.returncode == 0, result.stderr
    assert "re-sent own\n" in result.stdout
    assert "re-sent foreign by name (no such task in this app" in result.stdout
    assert "2 runs re-sent, 0 keys marked dead" in result.stdout
    leases = {row.split()[0]: row for row in lines(cli("leases", app="incapp"))[1:]}
    assert "expired" in leases["foreign"] and "1 sent, not started" in leases["foreign"]
    assert "dead" not in leases["own"]


SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # the SQLite store's clock


def _expire(cli: Cli, key: str, ago: float) -> None:
    """Move ``key``'s lease expiry to ``ago`` seconds before the store's now (its holder went silent)."""
    store = cli.store()
    try:
        with store.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE fence_leases SET expires_at = {SQLITE_NOW} - :ago WHERE key = :k"),
                {"k": key, "ago": ago},
            )
    finally:
        store.close()


def _run(key: str) -> dict[str, Any]:
    return {"task": "cliapp.charge", "id": key, "args": [1], "kwargs": {}}


def test_recover_says_which_expired_leases_it_skipped_and_why(cli: Cli) -> None:
    """A pass that re-sends nothing while leases show expired says why: expired less
    than --grace ago (the default grace is the ttl), or a copy sent earlier has not started yet. The
    library's own key (the recoverer's, expired too) is never counted."""
    store = cli.store()
    try:
        store.acquire("invoice:old", "host:9:gone", TTL, _run("invoice:old"))
        store.acquire("celery-fence:recoverer", "host:9:gone", TTL)
    finally:
        store.close()
    _expire(cli, "invoice:old", 10000.0)
    _expire(cli, "celery-fence:recoverer", 10000.0)
    first = cli("recover", "--grace", "0")
    assert lines(first) == ["re-sent invoice:old by name (no such task in this app: left to the workers that "
                            "know it)", "1 run re-sent, 0 keys marked dead"]  # fmt: skip
    store = cli.store()
    try:
        store.acquire("invoice:new", "host:9:gone", TTL, _run("invoice:new"))
    finally:
        store.close()
    _expire(cli, "invoice:new", 1.0)
    result = cli("recover", "--grace", "60")
    assert result.returncode == 0, result.stderr
    out = lines(result)
    assert out[0] == "0 runs re-sent, 0 keys marked dead"
    assert re.fullmatch(
        r"1 expired lease skipped: expired less than --grace 60s ago; run again after \d\d:\d\d:\d\d UTC or "
        r"pass --grace 0",
        out[1],
    ), out
    assert re.fullmatch(
        r"1 expired lease skipped: a copy sent by an earlier pass has not started yet \(queued\): the next "
        r"is sent no sooner than 1, 1, 2, 4 \.\.\. 32 graces after the last; run again after "
        r"\d\d:\d\d:\d\d UTC",
        out[2],
    ), out
    assert len(out) == 3
    default = lines(cli("recover"))  # the default grace: the ttl (30 s)
    assert default[1].startswith(
        "1 expired lease skipped: expired less than --grace 30s (the default: the lease ttl) ago; run again"
    ), default


def test_leases_counts_a_copy_that_completed_or_runs_as_not_lost_and_hides_internal_keys(cli: Cli) -> None:
    """operating.md's RECOVERY column counts as lost only copies that started and were
    lost again; a copy that completed the key, or holds it now, is said so. celery-fence's own keys are
    listed only with --internal, and not counted by verify."""
    store = cli.store()
    try:
        keys = ("invoice:completed", "invoice:running", "invoice:lost", "invoice:released")
        for key in keys:
            store.acquire(key, "host:9:gone", TTL, _run(key))
            _expire(cli, key, 10000.0)
        for seen in store.abandoned(0.0):
            assert store.recover(seen, 3) == 1  # each one's copy sent
        copies = {key: store.acquire(key, f"host:7:{key}", TTL, _run(key)) for key in keys}  # each started
        store.complete(copies["invoice:completed"], "paid")
        store.release(copies["invoice:released"])  # that copy raised: it gave the key back
        store.acquire("celery-fence:recoverer", "host:7:elected", TTL)
    finally:
        store.close()
    _expire(cli, "invoice:lost", 10000.0)  # this copy's worker died too
    every = {row.split()[0]: row.split(maxsplit=5)[5] for row in lines(cli("leases", "--all"))[1:]}
    assert every == {
        "invoice:completed": "1 completed",
        "invoice:running": "1 running",
        "invoice:lost": "1 lost",
        "invoice:released": "1 released",
    }
    assert "celery-fence:recoverer" in lines(cli("leases", "--internal"))[1]
    assert cli("verify").stdout == "no violations in 14 events over 4 keys\n"
    assert cli("verify", "--internal").stdout == "no violations in 15 events over 5 keys\n"
