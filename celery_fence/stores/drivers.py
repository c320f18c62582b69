"""A store's missing driver as a ``ConfigurationError`` that names the pip command, not an ``ImportError``
from deep inside a worker."""

from __future__ import annotations

import importlib.util

from ..errors import ConfigurationError

__all__ = ["missing_driver", "require_driver"]


def missing_driver(store: str, module: str, extra: str | None) -> ConfigurationError:
    """``extra``: the celery-fence extra that brings ``module``, if one does."""
    fix = f"pip install 'celery-fence[{extra}]'" if extra else f"pip install {module}"
    return ConfigurationError(f"the {store!r} store needs the {module!r} package: {fix}")


def require_driver(store: str, module: str, extra: str | None) -> None:
    """For a driver imported late (SQLAlchemy's): look for it before anything needs it."""
    if importlib.util.find_spec(module) is None:
        raise missing_driver(store, module, extra)
