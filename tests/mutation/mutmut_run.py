"""mutmut over the run path (``python -m tests.mutation.mutmut_run``; ``make mutation``).

mutmut 3 (configured in setup.cfg ``[mutmut]``) mutates whole files; this picks the mutants of the modules
asked for (all of the run path by default; the SQL store's ``store.py`` only in ``acquire`` and
``complete``), samples them if asked, runs them with one child, and prints killed and surviving mutants per
module. ``mutmut show NAME`` prints a survivor's diff; ``mutmut apply NAME`` writes it into the tree.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

MUTANTS = Path("mutants")
# Module -> the mutant names (globs) that stand for it.
MODULES = {
    "_decide": ["celery_fence._decide.*"],
    "run": ["celery_fence.run.*"],
    "_resends": ["celery_fence._resends.*"],
    "fence": ["celery_fence.fence.*"],
    "task": ["celery_fence.task.*"],
    "sql.run": ["celery_fence.stores.sql.run.*"],
    "sql.store": [
        "celery_fence.stores.sql.store.xǁSQLStoreǁacquire__mutmut_*",
        "celery_fence.stores.sql.store.xǁSQLStoreǁcomplete__mutmut_*",
    ],
}
STATUS = {1: "killed", 3: "killed", 0: "survived", 33: "no tests", 5: "no tests", 36: "timeout"}
STATUS.update({-24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 37: "type check"})


def results() -> dict[str, int | None]:
    """Every generated mutant's name and its exit code (``None``: not run yet)."""
    found: dict[str, int | None] = {}
    for meta in MUTANTS.rglob("*.meta"):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def mutmut(*args: str) -> int:
    return subprocess.call([str(Path(sys.executable).parent / "mutmut"), *args])


def generate() -> None:
    """mutmut generates mutants (and runs the tests once to map tests to functions) only on ``run``:
    ask for a mutant that does not exist, which stops right after that (with an AssertionError)."""
    if not results():
        mutmut("run", "--max-children", "1", "celery_fence.__generate_only__")
    if not results():
        sys.exit("mutmut generated no mutants (see its output above)")


def chosen(modules: list[str], sample: int, seed: int, survivors: bool = False) -> dict[str, list[str]]:
    codes = results()
    names = sorted(n for n in codes if not survivors or status(codes[n]) != "killed")
    picked: dict[str, list[str]] = {}
    for module in modules:
        patterns = MODULES.get(module, [module])
        matching = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if sample and len(matching) > sample:
            matching = sorted(random.Random(seed).sample(matching, sample))
        picked[module] = matching
    return picked


def status(code: int | None) -> str:
    return "not run" if code is None else STATUS.get(code, "suspicious")


def summary(picked: dict[str, list[str]], total: dict[str, int], seconds: float) -> None:
    codes = results()
    print(f"\n{'module':<12} {'mutants':>8} {'run':>5} {'killed':>7} {'survived':>9}  other")
    for module, names in picked.items():
        counts = Counter(status(codes.get(name)) for name in names)
        other = {k: v for k, v in counts.items() if k not in ("killed", "survived")}
        share = 100 * counts["killed"] / max(1, len(names))
        print(
            f"{module:<12} {total[module]:>8} {len(names):>5} {counts['killed']:>7} "
            f"{counts['survived']:>9}  {other or ''} ({share:.0f}% killed)"
        )
    for names in picked.values():
        for name in names:
            if status(codes.get(name)) != "killed":
                print(f"  {status(codes.get(name)):<9} {name}")
    print(f"\n{seconds / 60:.1f} min")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES), help=f"of {list(MODULES)}, or globs")
    parser.add_argument("--sample", type=int, default=0, help="at most this many mutants per module")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--max-children", default="1")
    parser.add_argument("--survivors", action="store_true", help="only the mutants not killed last time")
    args = parser.parse_args(argv)
    started = time.monotonic()
    generate()
    total = {m: len(names) for m, names in chosen(args.modules, 0, 0).items()}
    picked = chosen(args.modules, args.sample, args.seed, args.survivors)
    names = [name for group in picked.values() for name in group]
    print(f"running {len(names)} mutants: " + ", ".join(f"{m} {len(n)}" for m, n in picked.items()))
    mutmut("run", "--max-children", args.max_children, *names)
    if args.survivors:  # the figures are of every mutant of the modules, not of the ones run again
        picked = chosen(args.modules, args.sample, args.seed)
    summary(picked, total, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
