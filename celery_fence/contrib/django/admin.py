"""Read-only admin pages for the ``fence_*`` tables: every lease (its state, token, owner, expiry by the
database's clock, recovery) and each key's history. Nothing can be added, changed or deleted here: the
``celery fence`` commands (release, prune, advance, recover) are the way to change a lease."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.db import router
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from ...stores.django.store import database_clock
from .models import HistoryEvent, Lease

__all__ = ["HistoryAdmin", "LeaseAdmin"]


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Lease)
class LeaseAdmin(_ReadOnly):
    list_display = ("key", "state", "token", "owner", "expires", "recoveries", "dead", "history")
    search_fields = ("key", "owner")
    list_filter = ("done",)
    _now: float | None = None

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._now = database_clock(router.db_for_read(Lease))  # one read per page, not one per row
        return super().changelist_view(request, extra_context)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
                    ) -> HttpResponse:
        self._now = database_clock(router.db_for_read(Lease))
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="state")
    def state(self, lease: Lease) -> str:
        """What ``celery fence leases`` says: done, held, expired (abandoned until recovered), free, dead."""
        if lease.done:
            return "done"
        if lease.dead:
            return "dead"
        if lease.expires_at is None:
            return "free"
        return "held" if self._expires_in(lease) > 0 else "expired"

    @admin.display(description="expires in (database clock)")
    def expires(self, lease: Lease) -> str:
        if lease.expires_at is None:
            return "-"
        return f"{self._expires_in(lease):.1f} s"

    @admin.display(description="history")
    def history(self, lease: Lease) -> str:
        url = reverse("admin:celery_fence_historyevent_changelist")
        return format_html('<a href="{}?key={}">history</a>', url, lease.key)

    def _expires_in(self, lease: Lease) -> float:
        now = self._now if self._now is not None else database_clock(router.db_for_read(Lease))
        return float(lease.expires_at or 0.0) - now


@admin.register(HistoryEvent)
class HistoryAdmin(_ReadOnly):
    list_display = ("when", "key", "event", "token", "owner", "detail")
    list_filter = ("event",)
    search_fields = ("key", "owner")

    def get_queryset(self, request: HttpRequest) -> Any:
        found = super().get_queryset(request)
        key = request.GET.get("key")  # the lease page's link: one key's history, oldest first
        return found if key is None else found.filter(key=key)

    @admin.display(description="at (database clock, UTC)", ordering="id")
    def when(self, event: HistoryEvent) -> str:
        at = datetime.datetime.fromtimestamp(event.at, datetime.timezone.utc)
        return at.isoformat(timespec="milliseconds")
