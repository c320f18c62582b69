"""``python -m benchmarks [--quick] [--only NAME[,NAME]] [--stores S[,S]]``: every benchmark, one by one.

Prints the machine first, each module's progress, and a short summary last. A full run writes
``benchmarks/results.json`` (one key per figure under ``figures``, the details under each module's name) and
the generated tables of ``docs/performance.md``; ``--quick`` or ``--only`` write ``results.partial.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import machine, report
from .deps import ensure_bench_extra
from .stores import STORES

HERE = Path(__file__).resolve().parent
MODULES = (
    "throughput",
    "roundtrips",
    "store_ops",
    "renew",
    "takeover",
    "acquire_scaling",
    "curve",
    "transactions",
    "fence_cost",
)


def _log(message: str) -> None:
    print(message, flush=True)


def _clean_broker() -> None:
    """Drop the broker bookkeeping the runs left on db 11 (killed workers' unacked messages would otherwise
    be restored into a later run's queues an hour later)."""
    from .services import drop_redis_keys

    ours = ("_kombu.binding*fence_bench*", "fence_bench.*")
    drop_redis_keys(*ours, "unacked", "unacked_index", "unacked_mutex")


def _plan(args: argparse.Namespace) -> dict[str, Callable[[], dict[str, Any]]]:
    quick, stores = args.quick, tuple(args.stores)

    def throughput() -> dict[str, Any]:
        from . import throughput as m

        rounds = args.rounds or (1 if quick else 5)
        return m.run(rounds, args.tasks or (300 if quick else 1200), list(stores), _log)

    def roundtrips() -> dict[str, Any]:
        from . import roundtrips as m

        return m.run(50 if quick else 200, _log, stores)

    def store_ops() -> dict[str, Any]:
        from . import store_ops as m

        return m.run(1 if quick else 3, 0.7 if quick else 1.5, _log)

    def renew() -> dict[str, Any]:
        from . import renew as m

        return m.run(_log, stores)

    def takeover() -> dict[str, Any]:
        from . import takeover as m

        return m.run(1 if quick else 5, _log, stores)

    def acquire_scaling() -> dict[str, Any]:
        from . import acquire_scaling as m

        return m.run(100 if quick else 500, _log)

    def curve() -> dict[str, Any]:
        from . import curve as m

        return m.run(args.rounds or (1 if quick else 5), args.tasks or (300 if quick else 1200), _log)

    def transactions() -> dict[str, Any]:
        from . import transactions as m

        rounds, tasks = args.rounds or (1 if quick else 5), args.tasks or (300 if quick else 1200)
        return m.run(rounds, tasks, _log, 2.0 if quick else 5.0)

    def fence_cost() -> dict[str, Any]:
        from . import fence_cost as m

        rounds, tasks = args.rounds or (1 if quick else 5), args.tasks or (300 if quick else 1200)
        return m.run(rounds, tasks, 50 if quick else 200, _log, stores, args.rtt_ms)

    steps = (
        throughput,
        roundtrips,
        store_ops,
        renew,
        takeover,
        acquire_scaling,
        curve,
        transactions,
        fence_cost,
    )
    plan = dict(zip(MODULES, steps, strict=True))
    return {name: plan[name] for name in args.only}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round, fewer tasks: for iterating")
    parser.add_argument(
        "--only", default=",".join(MODULES), help=f"comma-separated, of: {', '.join(MODULES)}"
    )
    parser.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated, of: {', '.join(STORES)}"
    )
    parser.add_argument(
        "--rounds", type=int, help="throughput, curve, transactions, fence_cost rounds (default 5, quick 1)"
    )
    parser.add_argument("--tasks", type=int, help="their tasks per batch (default 1200, quick 300)")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/performance.md alone")
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0,
        help="fence_cost only: PostgreSQL this many ms away from the workers (benchmarks/network.py)",
    )
    args = parser.parse_args(argv)
    args.only = [m.strip() for m in args.only.split(",") if m.strip()]
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [m for m in args.only if m not in MODULES] + [s for s in args.stores if s not in STORES]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    ensure_bench_extra(_log)
    full = not args.quick and args.only == list(MODULES) and args.stores == list(STORES)
    started = time.monotonic()
    results: dict[str, Any] = {
        "command": "python -m benchmarks " + " ".join(argv),
        "machine": machine.describe(),
    }
    _log(machine.text(results["machine"]))
    errors: dict[str, str] = {}
    for name, run in _plan(args).items():
        _log(f"\n== {name} ==")
        began = time.monotonic()
        try:
            results[name] = run()
        except Exception as exc:  # one failing comparison must not lose the others
            traceback.print_exc()
            errors[name] = f"{type(exc).__name__}: {exc}"
        _log(f"   ({time.monotonic() - began:.0f} s)")
    _clean_broker()
    elapsed = time.monotonic() - started
    results |= {"elapsed_seconds": round(elapsed, 1), "errors": errors}
    results["finished_at"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = report.targets(results)
    results = {"figures": report.figures(results), **results}
    out = HERE / ("results.json" if full else "results.partial.json")
    out.write_text(json.dumps(results, indent=1) + "\n")
    _log(f"\nresults: {out}")
    if full and not args.no_docs and report.update_docs(results):
        _log(f"tables: {report.DOCS}")
    _log("\n" + report.summary_text(results, elapsed))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
