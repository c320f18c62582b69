"""The shop's Django settings: one PostgreSQL database, the orders app, celery-fence's app, and the
Celery settings read through the ``CELERY_`` namespace (shopsite/celery.py)."""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only")
DEBUG = False
ALLOWED_HOSTS = ["localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "celery_fence.contrib.django",  # the fence_* tables (manage.py migrate), the admin pages, the check
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shopsite.urls"
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
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_DATABASE", "celery_fence_shop"),
        "USER": os.environ.get("SHOP_DATABASE_USER", "postgres"),
        "PASSWORD": os.environ.get("SHOP_DATABASE_PASSWORD", ""),
        "HOST": os.environ.get("SHOP_DATABASE_HOST", "127.0.0.1"),
        "PORT": os.environ.get("SHOP_DATABASE_PORT", "5432"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

# Celery, as Celery's "First steps with Django" has it; celery-fence's settings are CELERY_FENCE_*.
CELERY_BROKER_URL = os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("SHOP_RESULT_BACKEND", "redis://127.0.0.1:6379/0")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_FENCE_STORE_URL = "django://default"  # the leases live in the database the ORM writes go to
CELERY_FENCE_LEASE_TTL = int(os.environ.get("SHOP_FENCE_LEASE_TTL", "30"))  # the worker tests take 3 s
