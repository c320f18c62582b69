"""The ``bench`` extra (setup.cfg: the peers and the profiler), installed on first use.

``make bench`` creates the venv with the ``dev`` extra only; the peers the benchmarks compare against are
not dependencies of celery-fence, so they come from the ``bench`` extra, with the versions pinned there.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

SETUP_CFG = Path(__file__).resolve().parents[1] / "setup.cfg"


def bench_requirements() -> list[str]:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    return [line.strip() for line in config["options.extras_require"]["bench"].splitlines() if line.strip()]


def _missing(requirement: str) -> bool:
    name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
    try:
        version(name)
    except PackageNotFoundError:
        return True
    return False


def ensure_bench_extra(log: Any) -> None:
    """pip-install whatever of the ``bench`` extra is missing from this environment."""
    missing = [r for r in bench_requirements() if _missing(r)]
    if missing:
        log(f"installing the bench extra: {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)
