"""The ``fence_*`` tables as read-only Django models, for the admin pages (``admin``): unmanaged, so
Django never creates, alters or drops them (their migration is ``celery fence migrate``'s code)."""

from __future__ import annotations

from django.db import models

__all__ = ["HistoryEvent", "Lease"]


class Lease(models.Model):
    """One key's lease (``fence_leases``): its current token, holder and expiry, or its result."""

    key = models.CharField(max_length=1024, primary_key=True)
    token = models.BigIntegerField()
    owner = models.CharField(max_length=512, null=True)
    expires_at = models.FloatField(null=True)  # the database's clock, epoch seconds; NULL: not held
    done = models.BooleanField(default=False)
    result = models.TextField(null=True)
    run = models.TextField(null=True)
    recoveries = models.IntegerField(default=0)
    recovery_sent = models.IntegerField(default=0)
    dead = models.TextField(null=True)
    finished_at = models.FloatField(null=True)
    recovered_at = models.FloatField(null=True)
    event = models.CharField(max_length=32)
    detail = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "fence_leases"
        ordering = ("key",)
        verbose_name = "lease"

    def __str__(self) -> str:
        return f"{self.key} (token {self.token})"


class HistoryEvent(models.Model):
    """One line of the audit trail (``fence_history``)."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=1024)
    at = models.FloatField()  # the database's clock, epoch seconds
    event = models.CharField(max_length=32)
    token = models.BigIntegerField()
    owner = models.CharField(max_length=512, null=True)
    detail = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "fence_history"
        ordering = ("id",)
        verbose_name = "history event"

    def __str__(self) -> str:
        return f"{self.key}: {self.event} {self.token}"
