"""Where a variant's CPU goes in a real worker: ``python -m benchmarks.profiling [--store S] [--variant V]``.

Starts the benchmark worker with ``FENCE_BENCH_PROFILE`` set: every process of the worker (the main process
and each pool child) runs ``cProfile`` with a CPU-time clock (``time.process_time``) from start to shutdown
and dumps it; the batches are the throughput benchmark's. Prints the functions that cost the most CPU per
task, by process kind, so that a missed target can be traced to a function. Profiling slows Python code
down, so read shares and per-task differences between variants, not absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init, worker_process_shutdown, worker_ready, worker_shutdown


def install(directory: Path) -> None:
    """In the worker (bench app): profile each process by CPU time and dump on shutdown."""
    profiles: dict[str, cProfile.Profile] = {}

    def start(kind: str) -> None:
        profile = cProfile.Profile(time.process_time)
        profiles[kind] = profile
        profile.enable()

    def dump(kind: str) -> None:
        profile = profiles.pop(kind, None)
        if profile is not None:
            profile.disable()
            profile.dump_stats(str(directory / f"{kind}-{os.getpid()}.prof"))

    worker_ready.connect(lambda **_: start("main"), weak=False)
    worker_shutdown.connect(lambda **_: dump("main"), weak=False)
    worker_process_init.connect(lambda **_: start("child"), weak=False)
    worker_process_shutdown.connect(lambda **_: dump("child"), weak=False)


def _line(tasks: int, key: tuple[str, int, str], row: tuple[Any, ...]) -> str:
    (path, line, name), (_cc, calls, own, cum, _callers) = key, row
    where = path.replace(str(Path(sys.prefix)), "<venv>").replace(str(Path.cwd()), ".")
    per = f"{own / tasks * 1e6:7.1f} µs own {cum / tasks * 1e6:8.1f} µs cum {calls / tasks:6.1f}x"
    return f"  {per}  {where}:{line}({name})"


def _report(directory: Path, kind: str, tasks: int, top: int, pattern: str) -> str:
    files = sorted(str(p) for p in directory.glob(f"{kind}-*.prof"))
    if not files:
        return f"(no {kind} profile)"
    stats, out = pstats.Stats(*files, stream=io.StringIO()), []
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    out.append(f"{kind} processes: {total / tasks * 1e6:.0f} µs CPU per task (profiled), top by own time:")
    items = stats.stats.items()  # type: ignore[attr-defined]
    out += [_line(tasks, k, v) for k, v in sorted(items, key=lambda kv: kv[1][2], reverse=True)[:top]]
    out.append(f"{kind} processes, by cumulative time, functions matching {pattern!r}:")
    chosen = [(k, v) for k, v in items if re.search(pattern, f"{k[0]}:{k[2]}")]
    out += [_line(tasks, k, v) for k, v in sorted(chosen, key=lambda kv: kv[1][3], reverse=True)[:top]]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    import tempfile

    from sqlalchemy import create_engine, text

    from . import throughput
    from .bench_app import ROWS_DDL, app
    from .cpu import CpuMeter
    from .services import pg_schema
    from .stores import lease_store, opened

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profiling")
    parser.add_argument("--store", default="postgresql")
    parser.add_argument("--variant", default="fenced")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default=r"celery_fence|benchmarks/|engine/base.py:(connect|close|execute)")
    parser.add_argument("--keep", type=Path, help="copy the profiles to this directory (to compare variants)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fence-bench-prof-") as tmp, pg_schema("prof") as schema:
        throughput._create_user_tables(schema)
        os.environ["FENCE_BENCH_PROFILE"] = tmp
        try:
            with (
                lease_store(args.store, schema, private_redis=True) as lease,
                throughput.bench_worker(app, args.store, lease, schema) as worker,
                opened(lease.url) as store,
            ):
                rows = create_engine(throughput.rows_url(lease, schema))  # the row-writing variants' table
                with rows.begin() as conn:
                    conn.execute(text(ROWS_DDL))
                ctx = {"store": store, "schema": schema, "peer_redis": lease.redis_url or "", "rows": rows}
                meter = CpuMeter(worker, lease.server_pid)
                throughput.batch(app, meter, ctx, args.variant, 200)
                rate, _send, cpu, _ok, _n = throughput.batch(app, meter, ctx, args.variant, args.tasks)
        finally:
            del os.environ["FENCE_BENCH_PROFILE"]
        print(f"{args.variant} on {args.store}: {rate:.0f} tasks/s under the profiler; CPU µs/task {cpu}")
        for kind in ("child", "main"):
            print(_report(Path(tmp), kind, args.tasks + 200, args.top, args.match))
        if args.keep is not None:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
