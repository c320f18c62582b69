"""The shop's URLs: Django's admin, where celery-fence's read-only lease pages are."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
