"""docs/architecture.md stays true: every module and test file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def test_every_module_the_architecture_page_names_exists() -> None:
    named = set(re.findall(r"`((?:celery_fence|tests)/[\w/]*\.py|celery_fence/[\w/]+/)`", PAGE.read_text()))
    assert len(named) > 20
    assert sorted(name for name in named if not (ROOT / name).exists()) == []


def test_the_page_names_every_top_level_module_of_the_package() -> None:
    text = PAGE.read_text()
    modules = [p for p in (ROOT / "celery_fence").glob("*.py") if p.name != "__init__.py"]
    public = [p for p in modules if not p.name.startswith("_")]
    unnamed = [p.name for p in public if f"celery_fence/{p.name}" not in text and f"`{p.name}`" not in text]
    assert unnamed == []
