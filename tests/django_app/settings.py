"""The Django settings of tests/django_app, for this process (``conftest.py`` hands them to
``settings.configure``) and for the real workers it starts (``DJANGO_SETTINGS_MODULE``): the same two
databases, named by the environment ``conftest.py`` sets, which the workers inherit."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

_PG = urlsplit(os.environ.get("FENCE_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/postgres")
_XDIST = os.environ.get("PYTEST_XDIST_WORKER", "")
PG_DATABASE = "celery_fence_django_test" + (f"_{_XDIST}" if _XDIST else "")
# The first process to read these settings (pytest's) makes the SQLite folder, and the processes it starts
# inherit it (its pytest-xdist workers, each with a folder of its own in it; their celery workers).
if "FENCE_DJANGO_SQLITE_DIR" not in os.environ:
    os.environ["FENCE_DJANGO_SQLITE_DIR"] = tempfile.mkdtemp(prefix="celery-fence-django-")
SQLITE_DIR = Path(os.environ["FENCE_DJANGO_SQLITE_DIR"]) / (_XDIST or "main")  # made by the tests' fixture

SECRET_KEY = "tests-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "celery_fence.contrib.django",
    "tests.django_app.orders",
]
ROOT_URLCONF = "tests.django_app.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(SQLITE_DIR / "django.db")},
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_DATABASE,
        "USER": _PG.username or "postgres",
        "PASSWORD": _PG.password or "",
        "HOST": _PG.hostname or "127.0.0.1",
        "PORT": str(_PG.port or 5432),
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

# What a Django project's settings.py holds for Celery, read by app.config_from_object(..., namespace=
# "CELERY"); the misspelt one is for the start-up check's "did you mean". A real worker is told its store,
# broker and result backend by the test (FENCE_DJANGO_*).
CELERY_FENCE_STORE_URL = os.environ.get("FENCE_DJANGO_STORE", "django://default")
CELERY_FENCE_LEASE_TTL = 60
CELERY_FENCE_LEASE_TTLL = 61
CELERY_BROKER_URL = os.environ.get("FENCE_DJANGO_BROKER", "memory://")
CELERY_RESULT_BACKEND = os.environ.get("FENCE_DJANGO_BACKEND", "cache+memory://")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
