"""The URLs of tests/django_app's settings: Django's admin, with celery-fence's pages in it."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
