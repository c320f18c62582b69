"""An order, written by the fenced tasks of tests/django_app through the ORM."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    key = models.CharField(max_length=200)  # the fence key of the run that wrote it
    what = models.CharField(max_length=200)
    paid = models.IntegerField(default=0)

    class Meta:
        app_label = "orders"
